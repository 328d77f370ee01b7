"""``python -m eagle3_pipeline.runtime.guard PARENT_PID [--remove PATH]... -- CMD...``: run CMD,
and kill its whole process group if the stage that started it dies.

A stage stops its children itself on errors, Ctrl-C and SIGTERM; a stage killed with
SIGKILL (the OOM killer, ``kill -9``, a scheduler's hard stop) runs no code, and its
``vllm serve`` or torchrun would keep the GPUs and the port. So every child group is led
by this small process (:func:`eagle3_pipeline.runtime.processes.start_group`): it starts CMD
in its own group, ignores the group's SIGTERM/SIGINT (CMD gets them and shuts down in
order; the guard exits when CMD has, with its exit status), and once its parent is gone it
sends SIGTERM to the group, waits, then SIGKILL. Each ``--remove`` path (a directory
only CMD's run writes to, such as online extraction's staging files) is deleted once CMD
has exited, so a killed stage leaves no such files either.

Kept free of imports beyond the standard library: it starts with every child.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

POLL_S = 0.5
# between SIGTERM and SIGKILL once the parent is gone: longer than torchrun's own 30 s for
# its workers (which it starts in sessions of their own, out of this group's reach)
GRACE_S = 40.0


def _orphaned(parent: int) -> bool:
    return os.getppid() != parent


def _remove(paths: list[str]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def _kill_group(child: subprocess.Popen[bytes], remove: list[str]) -> None:
    pgid = os.getpgid(0)
    os.killpg(pgid, signal.SIGTERM)  # reaches us too: ignored
    deadline = time.monotonic() + GRACE_S
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    _remove(remove)  # before the SIGKILL, which ends this process too
    os.killpg(pgid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") < 1 or argv.index("--") == len(argv) - 1:
        print(
            "usage: python -m eagle3_pipeline.runtime.guard PARENT_PID [--remove PATH]... -- CMD...",
            file=sys.stderr,
        )
        return 2
    sep = argv.index("--")
    parent, opts, cmd = int(argv[0]), argv[1:sep], argv[sep + 1 :]
    if os.getpgid(0) != os.getpid():  # run by hand: lead a group of our own, never the caller's
        os.setsid()
    remove = [opts[i + 1] for i in range(0, len(opts) - 1, 2) if opts[i] == "--remove"]
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # the child restores default handling (SIG_IGN would otherwise be inherited by exec)
    child = subprocess.Popen(cmd, preexec_fn=_default_signals)  # noqa: PLW1509
    try:
        if _orphaned(parent):  # died while we started
            _kill_group(child, remove)
        while True:
            try:
                rc = child.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                if _orphaned(parent):
                    _kill_group(child, remove)
                continue
            return rc if rc >= 0 else 128 - rc
    finally:
        _remove(remove)


def _default_signals() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
