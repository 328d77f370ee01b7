"""One log format for every process of a run: the stage entrypoints and the workers they
start (torchrun's training ranks) write interleaved to the same terminal."""

from __future__ import annotations

import logging
import sys


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    for noisy in ("httpx", "httpx2", "httpcore", "openai", "urllib3", "datasets", "filelock",
                  "fsspec"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
