"""SIGINT and SIGTERM as one exception, so that a stopped stage unwinds like a failed one.

Ctrl-C at the terminal (SIGINT) and DVC, a scheduler or ``kill`` (SIGTERM) must end a stage
the same way: every ``with`` block exits, so torchrun and ``vllm serve`` process groups
are stopped (:mod:`eagle3_pipeline.runtime.processes`) and nothing half-written stays
(:mod:`eagle3_pipeline.core.io` writes atomically); the stage then prints one line and a
rerun resumes exactly as after ``kill -9``. Python's default turns SIGINT into
``KeyboardInterrupt`` (a traceback) and lets SIGTERM kill the process outright (children
left running), hence these handlers.

:class:`Interrupted` derives from ``BaseException`` so that no ``except Exception`` in a
library swallows it. A second signal while the first unwinds is ignored with a note: the
cleanup it would cut short (stopping children, bounded by their stop timeouts) is exactly
what leaves GPUs free.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

HANDLED = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):  # noqa: N818 -- not an error: a request to stop
    """The process received ``signum``; raised in the main thread by the handler."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.signame = signal.Signals(signum).name
        super().__init__(f"interrupted by {self.signame}")

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process ended by a signal: 128 + its number."""
        return 128 + self.signum


@contextlib.contextmanager
def interrupts_raise() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise :class:`Interrupted` (once; later ones
    are noted and ignored until the block is left). Outside the main thread, where Python
    cannot set handlers, it does nothing. Handlers in place before are restored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = False

    def handler(signum: int, _frame: FrameType | None) -> None:
        nonlocal fired
        if fired:
            print(
                f"{signal.Signals(signum).name}: already stopping (child processes are "
                "being shut down); please wait",
                file=sys.stderr,
                flush=True,
            )
            return
        fired = True
        raise Interrupted(signum)

    old: dict[int, Any] = {sig: signal.signal(sig, handler) for sig in HANDLED}
    try:
        yield
    finally:
        for sig, previous in old.items():
            # None: set outside Python; the default is the closest
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
