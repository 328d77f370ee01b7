"""Read the next packed batches while the current step computes.

A step waits on its batch: offline, reading ``hs_{i}`` files and collating them; online,
a round trip to the vLLM extraction server for each row. One background thread runs the
loader ``depth`` batches ahead into a bounded queue, so at most ``depth`` batches wait,
besides the one training and the one the thread is filling (the bound online mode
promises). On CUDA the batch is also
pinned there, so the step's ``non_blocking`` copies really are asynchronous.

Order is the loader's: the same batches reach the step in the same order as without it,
so the trajectory is unchanged. An error in the thread is raised in the step's thread at
the batch it concerns; leaving early (an error or a finished run) stops the thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Generator, Iterable
from typing import Any

log = logging.getLogger(__name__)
_END = object()


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _pin(batch: Any) -> Any:
    if isinstance(batch, dict):
        return {k: _pin(v) for k, v in batch.items()}
    pin = getattr(batch, "pin_memory", None)
    return pin() if callable(pin) else batch


def prefetch(
    items: Iterable[Any], depth: int, pin_memory: bool = False
) -> Generator[Any, None, None]:
    """``items`` in order, produced up to ``depth`` ahead by one thread (``depth`` 0:
    in this thread, as a plain loop)."""
    if depth <= 0:
        for item in items:
            yield _pin(item) if pin_memory else item
        return
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(obj: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(obj, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(_pin(item) if pin_memory else item):
                    return
        except BaseException as exc:  # raised again in the consumer's thread
            put(_Failed(exc))
            return
        put(_END)

    thread = threading.Thread(target=produce, name="eagle3-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.exc
            yield item
    finally:
        stop.set()
        thread.join(timeout=60)
        if thread.is_alive():  # a request still in flight: say so rather than hang
            log.warning("prefetch thread still busy 60 s after the loop stopped")
