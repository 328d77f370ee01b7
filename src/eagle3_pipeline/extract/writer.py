"""Writing hidden-state files: atomic per file, off the compute thread.

Resume trusts any ``hs_{i}.safetensors`` that is complete, so a file must appear only
whole (temp name, fsync, rename). Serializing while the next batch computes keeps the
stage near the speed of the slower of the two.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.errors import StageError
from eagle3_pipeline.extract.layout import hs_path, temp_path
from eagle3_pipeline.runtime.faults import FAULT_EXIT_CODE

log = logging.getLogger(__name__)

# Name of the test-only fault (environment variable EAGLE3_FAULT_EXTRACT_FAIL_AFTER): the
# writer dies mid-batch after this many complete batches.
FAULT_NAME = "extract_fail_after"


@dataclass
class Timings:
    """Where an extraction's time and bytes went (the stage's metrics)."""

    forward_s: float = 0.0
    capture_s: float = 0.0
    serialize_s: float = 0.0
    fsync_s: float = 0.0
    queue_wait_s: float = 0.0
    bytes_written: int = 0
    files_written: int = 0


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_hidden_states(
    path: Path, token_ids: Any, hidden_states: Any, fsync: bool, timings: Timings | None = None
) -> int:
    """Write one file atomically (temp name in the same directory, fsync, rename); return
    its size. A crash at any point leaves either no file or a complete one."""
    from safetensors.torch import save_file

    tmp = temp_path(path)
    try:
        t0 = time.perf_counter()
        save_file({"token_ids": token_ids, "hidden_states": hidden_states}, str(tmp))
        t1 = time.perf_counter()
        if fsync:
            _fsync_path(tmp)
        t2 = time.perf_counter()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    size = path.stat().st_size
    if timings is not None:
        timings.serialize_s += t1 - t0
        timings.fsync_s += t2 - t1
        timings.bytes_written += size
        timings.files_written += 1
    return size


def fsync_dir(path: Path) -> None:
    """Make the renames of a batch durable (a rename lives in the directory's metadata)."""
    _fsync_path(path)


_STOP = object()


class BatchWriter:
    """A thread that writes finished batches while the next one computes.

    The queue holds at most ``depth`` batches, so memory stays bounded by the model plus
    a few batches whatever the dataset size. An error in the writer surfaces in the main
    thread at the next :meth:`put` or at :meth:`close`."""

    def __init__(
        self, out: Path, depth: int, fsync: bool, timings: Timings, fail_after: int | None = None
    ) -> None:
        self.out = out
        self.fsync = fsync
        self.timings = timings
        self.fail_after = fail_after
        self.batches_done = 0
        self.error: BaseException | None = None
        self._q: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
        self._abort = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hs-writer", daemon=True)
        self._thread.start()

    def put(self, items: list[tuple[int, Any, Any]]) -> None:
        t0 = time.perf_counter()
        while True:
            self._raise_if_failed()
            try:
                self._q.put(items, timeout=0.2)
                break
            except queue.Full:
                continue
        self.timings.queue_wait_s += time.perf_counter() - t0

    def close(self) -> None:
        """Flush everything queued, stop the thread, re-raise a writer error."""
        while self._thread.is_alive():
            self._raise_if_failed()
            try:
                self._q.put(_STOP, timeout=0.2)
                break
            except queue.Full:
                continue
        self._thread.join()
        self._raise_if_failed()

    def abort(self) -> None:
        """Stop after the file being written (complete files stay; they are resumable)."""
        self._abort.set()
        with contextlib.suppress(queue.Full):
            self._q.put_nowait(_STOP)
        self._thread.join(timeout=60)

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            err = self.error
            if isinstance(err, OSError):
                raise StageError(f"{self.out}: writing hidden states failed: {err}") from err
            raise err

    def _run(self) -> None:
        try:
            while not self._abort.is_set():
                items = self._q.get()
                if items is _STOP:
                    return
                if self.fail_after is not None and self.batches_done == self.fail_after:
                    self._die_mid_batch(items)
                for row, tok, hs in items:
                    if self._abort.is_set():
                        return
                    save_hidden_states(hs_path(self.out, row), tok, hs, self.fsync, self.timings)
                if self.fsync:
                    fsync_dir(self.out)
                self.batches_done += 1
        except BaseException as exc:  # surfaced in the main thread
            self.error = exc

    def _die_mid_batch(self, items: list[tuple[int, Any, Any]]) -> None:
        """The test-only fault: half of this batch written, a file cut mid-write, then a
        hard exit that runs no cleanup -- what a kill or power cut leaves behind."""
        from safetensors.torch import save

        half = items[: len(items) // 2]
        for row, tok, hs in half:
            save_hidden_states(hs_path(self.out, row), tok, hs, self.fsync, self.timings)
        if len(half) < len(items):
            row, tok, hs = items[len(half)]
            data = save({"token_ids": tok, "hidden_states": hs})
            temp_path(hs_path(self.out, row)).write_bytes(data[: len(data) // 2])
        log.error("fault %s=%d: injected fault, exiting", FAULT_NAME, self.fail_after)
        logging.shutdown()
        os._exit(FAULT_EXIT_CODE)
