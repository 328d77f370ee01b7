"""What every stage entrypoint shares: logging, config loading, and turning expected
failures into one actionable line and a non-zero exit instead of a traceback."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import TypeVar

from eagle3_pipeline.core.config import Config, config_from_cli
from eagle3_pipeline.core.errors import ConfigError, StageError
from eagle3_pipeline.core.inputs import Inputs
from eagle3_pipeline.core.logs import log_repeat_summary, setup_logging
from eagle3_pipeline.runtime.keep import Keeper, volatile_outputs
from eagle3_pipeline.runtime.signals import Interrupted, interrupts_raise

log = logging.getLogger("eagle3_pipeline")

V = TypeVar("V")


def run_stage(
    name: str,
    description: str,
    view: Callable[[Config], V],
    body: Callable[[V], None],
    argv: list[str] | None = None,
    restore_on_failure: bool = True,
) -> None:
    """Parse ``[--params FILE] [overrides]``, load the config, build the stage's input
    view from it (``view``: its ``Inputs.from_config``) and run ``body`` on the view.

    Exit codes: 0 success, 1 a failed check or bad input (one line on stderr), 2 a config
    error, 128 + N when stopped by signal N (130 Ctrl-C, 143 SIGTERM; one line too: the
    stage's ``with`` blocks have stopped its child processes and what it finished is kept,
    so a rerun resumes). Unexpected exceptions keep their traceback: they are bugs, not
    user errors.

    Whatever the failure, the stage's uncached outputs of its last success come back
    (:mod:`eagle3_pipeline.runtime.keep`); its cached ones, which DVC removed before running
    it, come back with ``dvc checkout <stage>``. A stage whose failure report *is* its
    output (preflight: the verdict of each check) passes ``restore_on_failure=False``.
    """
    keeper: Keeper | None = None
    try:
        with interrupts_raise():
            owner = getattr(view, "__self__", None)  # the Inputs class of INPUTS.from_config
            cfg, _args = config_from_cli(
                f"eagle3_pipeline.stages.{name}",
                description,
                argv,
                stage=name,
                keys=owner.keys()
                if isinstance(owner, type) and issubclass(owner, Inputs)
                else None,
            )
            setup_logging()
            keeper = Keeper(name, volatile_outputs(name, cfg)) if restore_on_failure else None
            try:
                body(view(cfg))
            except (ConfigError, StageError, FileNotFoundError) as exc:
                _restore(name, keeper)
                keeper = None
                log_repeat_summary()  # before the one line, so that it stays the last
                print(f"error: {name}: {exc}", file=sys.stderr)
                raise SystemExit(1) from None
            if keeper is not None:
                keeper.save()
            keeper = None
    except BaseException as exc:
        failed = not (isinstance(exc, SystemExit) and exc.code in (0, None))
        if failed:
            _restore(name, keeper)
        if isinstance(exc, Interrupted):
            _interrupted(name, exc)
        raise


def _restore(name: str, keeper: Keeper | None) -> None:
    if keeper is None:
        return
    try:
        restored = keeper.restore()
    except OSError as exc:
        print(f"warning: {name}: could not restore the last run's outputs ({exc})", file=sys.stderr)
        return
    if restored:
        print(
            f"note: {name}: the last successful run's {', '.join(map(str, restored))} "
            f"restored; `dvc checkout {name}` restores its cached outputs",
            file=sys.stderr,
        )


def _interrupted(name: str, stop: Interrupted) -> None:
    # a progress bar may hold the line: start a new one
    print(
        f"\nerror: {name}: {stop}; its child processes are stopped and its "
        "finished work is kept: rerun (`dvc repro`) to resume",
        file=sys.stderr,
    )
    raise SystemExit(stop.exit_code) from None
