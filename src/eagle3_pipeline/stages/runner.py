"""What every stage entrypoint shares: logging, config loading, and turning expected
failures into one actionable line and a non-zero exit instead of a traceback."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from eagle3_pipeline.core.config import Config, config_from_cli
from eagle3_pipeline.core.errors import ConfigError, StageError
from eagle3_pipeline.core.logs import setup_logging
from eagle3_pipeline.core.signals import Interrupted, interrupts_raise

log = logging.getLogger("eagle3_pipeline")


def run_stage(
    name: str, description: str, body: Callable[[Config], None], argv: list[str] | None = None
) -> None:
    """Parse ``[--params FILE] [overrides]``, load the config and run ``body``.

    Exit codes: 0 success, 1 a failed check or bad input (one line on stderr), 2 a config
    error, 128 + N when stopped by signal N (130 Ctrl-C, 143 SIGTERM; one line too: the
    stage's ``with`` blocks have stopped its child processes and what it finished is kept,
    so a rerun resumes). Unexpected exceptions keep their traceback: they are bugs, not
    user errors.
    """
    try:
        with interrupts_raise():
            cfg, _args = config_from_cli(f"eagle3_pipeline.stages.{name}", description, argv)
            setup_logging()
            try:
                body(cfg)
            except (ConfigError, StageError, FileNotFoundError) as exc:
                print(f"error: {name}: {exc}", file=sys.stderr)
                raise SystemExit(1) from None
    except Interrupted as stop:
        # a progress bar may hold the line: start a new one
        print(f"\nerror: {name}: {stop}; its child processes are stopped and its "
              "finished work is kept: rerun (`dvc repro`) to resume", file=sys.stderr)
        raise SystemExit(stop.exit_code) from None

