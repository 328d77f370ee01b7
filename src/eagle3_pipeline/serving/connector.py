"""A CPU-safe hidden-states connector for vLLM's ``extract_hidden_states`` method.

Imported only inside the vLLM environment, by vLLM itself (``kv_connector_module_path``),
and only where the upstream ``ExampleHiddenStatesConnector`` cannot run: on the CPU build
it copies through a CUDA stream into pinned memory and fails with "pin_memory=True
requires a CUDA or other accelerator backend". On CUDA the upstream connector is used
unchanged (:func:`eagle3_pipeline.compat.vllm.hidden_states_connector` decides).

This subclass keeps every scheduler-side behaviour, the file name, the lock-file protocol
and the tensor layout (``hidden_states [seq, n_layers, hidden]`` in the model dtype,
``token_ids [seq]``), and replaces only the device-to-host copy: the slots are gathered
on the CPU and written synchronously before the lock is released.
"""

from __future__ import annotations

import fcntl
import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _Done:
    """Stands in for the CUDA event the upstream poller queries: the write is complete."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(0, self._block_size, dtype=torch.long)
        slots = (offsets.reshape(1, -1) + block_ids.reshape(-1, 1) * self._block_size).flatten()
        n = pending.token_ids.shape[0]
        states = extract_from_kv_cache(self._kv_cache, slots, n).to("cpu").clone()
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(
                pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644
            )
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        tmp = pending.filename + ".tmp"
        try:
            save_file(
                {"hidden_states": states.contiguous(), "token_ids": pending.token_ids.clone()}, tmp
            )
            os.replace(tmp, pending.filename)  # a reader never sees half a file
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
        self._req_copy_events[pending.req_id] = _Done()  # type: ignore[assignment]
