"""What every stage entrypoint shares: logging, config loading, and turning expected
failures into one actionable line and a non-zero exit instead of a traceback."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from eagle3_pipeline.core.config import Config, config_from_cli
from eagle3_pipeline.core.errors import ConfigError, StageError
from eagle3_pipeline.core.logs import setup_logging

log = logging.getLogger("eagle3_pipeline")


def run_stage(
    name: str, description: str, body: Callable[[Config], None], argv: list[str] | None = None
) -> None:
    """Parse ``[--params FILE] [overrides]``, load the config and run ``body``.

    Exit codes: 0 success, 1 a failed check or bad input (one line on stderr), 2 a config
    error. Unexpected exceptions keep their traceback: they are bugs, not user errors.
    """
    cfg, _args = config_from_cli(f"eagle3_pipeline.stages.{name}", description, argv)
    setup_logging()
    try:
        body(cfg)
    except (ConfigError, StageError, FileNotFoundError) as exc:
        print(f"error: {name}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None

