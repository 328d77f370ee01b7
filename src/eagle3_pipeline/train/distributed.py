"""Several workers (``torchrun``, started by the stage): the process group, the few
collectives the loop needs, and DDP or FSDP2 around the draft.

The backend follows the device: nccl on CUDA, gloo on CPU (``train.nproc=N`` runs N CPU
workers, which is how the multi-process path is tested on a machine without GPUs). FSDP2
(``fully_shard``) runs on CPU with gloo in torch 2.14 (checked: all-gather, reduce-scatter,
clip_grad_norm_ on DTensors and the full state-dict gather/scatter of
``torch.distributed.checkpoint.state_dict``), so the FSDP path is tested on CPU too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass
class Dist:
    rank: int = 0
    local_rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def dist_backend(device: str) -> str:
    """The process-group backend follows the device: nccl on CUDA, gloo on CPU."""
    return "nccl" if device == "cuda" else "gloo"


def init_distributed(device: str) -> Dist:
    """Join the torchrun group when started by torchrun, else a single process."""
    import torch
    import torch.distributed as dist

    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Dist()
    d = Dist(int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"]))
    if device == "cuda":
        torch.cuda.set_device(d.local_rank)
    dist.init_process_group(backend=dist_backend(device))
    return d


def close_distributed(d: Dist) -> None:
    """Leave the process group joined by :func:`init_distributed` (no-op for one process)."""
    if d.world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()


def all_reduce_ints(values: list[int], d: Dist, op: str = "sum") -> list[int]:
    """An all-reduce of small integer vectors (gloo and nccl; CPU tensors for gloo)."""
    if d.world <= 1:
        return list(values)
    import torch
    import torch.distributed as dist

    device = "cpu" if dist.get_backend() == "gloo" else f"cuda:{d.local_rank}"
    t = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN}[op])
    return [int(v) for v in t.tolist()]


def all_reduce_sums(values: dict[str, float], d: Dist, device: Any) -> dict[str, float]:
    """Per-rank metric sums added over the ranks (float64, on the training device)."""
    if d.world <= 1 or not values:
        return values
    import torch
    import torch.distributed as dist

    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist(), strict=True))


def wrap_parallel(model: Any, parallel: str, d: Dist, device: Any, autocast_dtype: Any) -> Any:
    """The module the loop calls forward on: DDP around the draft, the sharded draft itself
    under FSDP2, or the draft (one process). Call it before building the optimizer: FSDP
    replaces the parameters."""
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [d.local_rank] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    if parallel == "fsdp":
        shard(model, d, autocast_dtype)
    return model


def shard(model: Any, d: Dist, autocast_dtype: Any) -> None:
    """speculators' recipe (``Trainer._setup_model_fsdp`` + ``apply_fully_sharded``):
    ``fully_shard`` each decoder layer, then the draft; rank 0's weights are broadcast
    so every rank starts from the same draft. Parameters keep float32 master copies;
    on bf16 runs FSDP gathers them in bf16 and reduces gradients in float32."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
    )
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    full = model.state_dict() if d.main else {}
    mp = MixedPrecisionPolicy(param_dtype=autocast_dtype, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    set_model_state_dict(
        model,
        full,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False),
    )
    del full
    dist.barrier()


def local_fraction(model: Any) -> float:
    """Share of the parameters this rank holds: 1 unsharded, ~1/world under FSDP."""
    total = local = 0
    for p in model.parameters():
        total += p.numel()
        local += p.to_local().numel() if hasattr(p, "to_local") else p.numel()
    return local / total if total else 1.0
