"""One log format for every process of a run: the stage entrypoints and the workers they
start (torchrun's training ranks) write interleaved to the same terminal.

Repeated warnings of other libraries are counted, not printed: one that warns once per
row or per retry (speculators' loader and client, Python warnings) would otherwise bury the one line
that says what went wrong. The first :data:`REPEAT_LIMIT` of a kind (same logger, same
text with numbers masked) are shown; the rest are summarised in one line each when the
process ends (:func:`log_repeat_summary`; the stage runner calls it before its last line).
"""

from __future__ import annotations

import atexit
import logging
import re
import sys
from collections import Counter

REPEAT_LIMIT = 3
_NUMBER = re.compile(r"\d+")


class RepeatFilter(logging.Filter):
    """Let through the first ``limit`` warnings of each kind; count the rest."""

    def __init__(self, limit: int = REPEAT_LIMIT) -> None:
        super().__init__()
        self.limit = limit
        self.seen: Counter[tuple[str, str]] = Counter()
        self.examples: dict[tuple[str, str], str] = {}

    @staticmethod
    def kind(record: logging.LogRecord) -> tuple[str, str]:
        first = (record.getMessage().strip().splitlines() or [""])[0]
        return record.name, _NUMBER.sub("N", first)[:160]

    def filter(self, record: logging.LogRecord) -> bool:
        # ours say what they mean once (the bad-lines report names five, then the file)
        if record.levelno != logging.WARNING or record.name.startswith("eagle3_pipeline"):
            return True
        key = self.kind(record)
        self.seen[key] += 1
        self.examples.setdefault(key, (record.getMessage().strip().splitlines() or [""])[0])
        return self.seen[key] <= self.limit

    def summary(self) -> list[str]:
        """One line per kind that was cut, and forget them (so it is said once)."""
        lines = [
            f"{n - self.limit} more warning(s) like this from {name} not shown: "
            f"{self.examples[(name, k)][:200]}"
            for (name, k), n in self.seen.items()
            if n > self.limit
        ]
        self.seen.clear()
        return lines


_FILTER = RepeatFilter()


def log_repeat_summary() -> None:
    for line in _FILTER.summary():
        print(f"note: {line}", file=sys.stderr)


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    for noisy in (
        "httpx",
        "httpx2",
        "httpcore",
        "openai",
        "urllib3",
        "datasets",
        "filelock",
        "fsspec",
    ):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.captureWarnings(True)  # Python warnings pass the same filter
    for handler in logging.getLogger().handlers:
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
    atexit.register(log_repeat_summary)
