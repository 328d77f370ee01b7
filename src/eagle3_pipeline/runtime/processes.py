"""Child processes that never outlive the stage that started them.

A ``vllm serve`` or a ``torchrun`` left behind keeps its GPU memory, and the next run then
fails on the same GPUs far from the cause. Both start helper processes of their own
(vLLM's engine core and TP/PP workers, torchrun's ranks), which only a signal to the whole
process group reaches. So every such child starts in its own session (hence its own
process group; a Ctrl-C at the terminal reaches only the stage, which then stops the group
itself, in order), and stopping it is always the same sequence: SIGTERM to the group, a
bounded wait, SIGKILL; then SIGKILL to the group once more even when the leader has
exited, for members that outlived it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, TextIO

from eagle3_pipeline.runtime.signals import Interrupted

log = logging.getLogger(__name__)

TAIL_BYTES = 65536  # of a child's stderr kept for explaining its failure
KILL_WAIT_S = 30.0  # after SIGKILL; only a process stuck in the kernel (a wedged driver) waits


GUARD = "eagle3_pipeline.runtime.guard"


def start_group(
    cmd: Sequence[str], remove: Sequence[str | Path] = (), **popen_kwargs: Any
) -> subprocess.Popen[bytes]:
    """``cmd`` in a new session and process group (``Popen`` keywords pass through), so
    that :func:`stop_group` reaches every process it starts. The group's leader is
    :mod:`eagle3_pipeline.runtime.guard`, which kills the group if this process dies without
    stopping it (SIGKILL runs no cleanup here) and deletes the ``remove`` paths once
    ``cmd`` has exited."""
    opts = [a for p in remove for a in ("--remove", str(p))]
    guarded = [sys.executable, "-m", GUARD, str(os.getpid()), *opts, "--", *map(str, cmd)]
    return subprocess.Popen(guarded, start_new_session=True, **popen_kwargs)


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """``sig`` to ``proc``'s process group; a group that is already gone is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop_group(proc: subprocess.Popen[bytes], timeout_s: float, what: str) -> None:
    """SIGTERM the group, wait ``timeout_s``, SIGKILL it; then SIGKILL the group again for
    stray members, even if the leader exited."""
    if proc.poll() is None:
        signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("%s ignored SIGTERM for %.0fs: killing", what, timeout_s)
            signal_group(proc, signal.SIGKILL)
            try:
                proc.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                log.warning(
                    "%s (pid %d) still there %.0fs after SIGKILL", what, proc.pid, KILL_WAIT_S
                )
    signal_group(proc, signal.SIGKILL)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``, from /proc (Linux; empty
    elsewhere). Read before the final SIGKILL, it tells whether the leader left members
    behind, which a clean exit never does."""
    proc_dir = Path("/proc")
    found = []
    for entry in proc_dir.iterdir() if proc_dir.is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # state, ppid, pgrp, ...
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


class _Relay:
    """Copies a child's stdout and stderr to ours, byte for byte (progress bars' ``\r``
    included), until :meth:`mute`: a child stopped because the user interrupted the stage
    answers with its own shutdown traceback (torchrun's ``SignalException``), which would
    bury the stage's one-line message. Muted output is still drained, so the child never
    blocks on a full pipe. ``tail``, when given, keeps the last :data:`TAIL_BYTES` of the
    child's stderr (muted or not), for a caller that explains a failure from it."""

    def __init__(self, proc: subprocess.Popen[bytes], tail: bytearray | None = None) -> None:
        self.muted = False
        self.tail = tail
        self.threads = [
            threading.Thread(target=self._pump, args=(src, dst, keep), daemon=True)
            for src, dst, keep in (
                (proc.stdout, sys.stdout, False),
                (proc.stderr, sys.stderr, True),
            )
            if src
        ]
        for t in self.threads:
            t.start()

    def _pump(self, src: IO[bytes], dst: TextIO, keep: bool) -> None:
        fd = src.fileno()
        while chunk := os.read(fd, 65536):
            if keep and self.tail is not None:
                self.tail += chunk
                del self.tail[:-TAIL_BYTES]
            if self.muted:
                continue
            with contextlib.suppress(OSError, ValueError):  # our stream closed: drop
                if hasattr(dst, "buffer"):
                    dst.buffer.write(chunk)
                else:  # a text-only stream (a test's capture)
                    dst.write(chunk.decode("utf-8", errors="replace"))
                dst.flush()

    def mute(self) -> None:
        self.muted = True

    def join(self, timeout_s: float = 5.0) -> None:
        for t in self.threads:
            t.join(timeout_s)


@contextlib.contextmanager
def process_group(
    cmd: Sequence[str],
    stop_timeout_s: float,
    what: str,
    stderr_tail: bytearray | None = None,
    **popen_kwargs: Any,
) -> Iterator[subprocess.Popen[bytes]]:
    """:func:`start_group` for the ``with`` block, :func:`stop_group` when it is left,
    normally or by an error or Ctrl-C. Unless ``popen_kwargs`` redirect them, the child's
    stdout and stderr are relayed to ours, and silenced once the stage is interrupted
    (:class:`_Relay`); ``stderr_tail`` then receives the end of its stderr."""
    relay = None
    if "stdout" not in popen_kwargs and "stderr" not in popen_kwargs:
        popen_kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc = start_group(cmd, **popen_kwargs)
    if popen_kwargs.get("stdout") is subprocess.PIPE:
        relay = _Relay(proc, stderr_tail)
    try:
        yield proc
    except Interrupted:
        if relay is not None:
            relay.mute()
        raise
    finally:
        stop_group(proc, stop_timeout_s, what)
        if relay is not None:
            relay.join()


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies (Linux; a no-op
    elsewhere). torchrun starts each worker in a session of its own, out of reach of the
    signal to the agent's group, so a worker whose agent was killed with SIGKILL would
    train on alone; with this it stops, and its peers' collectives fail at once instead
    of waiting on it."""
    import ctypes
    import ctypes.util

    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent or parent == 1:  # died before the request took hold
        os.kill(os.getpid(), sig)
