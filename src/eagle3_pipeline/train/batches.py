"""What the loop reads, all speculators' code: its ``ArrowDataset`` over the prepared rows
and ``hs_{i}`` files (strict: a file whose tokens differ from its row is refused), its
multipack sampler (each rank takes its own share of every epoch's packs) and its
``CollateFn`` + ``shift_batch``."""

from __future__ import annotations

import logging
from typing import Any

from eagle3_pipeline.core.config import TrainConfig
from eagle3_pipeline.targets.adapter import TargetSpec
from eagle3_pipeline.train.distributed import Dist, all_reduce_ints
from eagle3_pipeline.train.online import Endpoint
from eagle3_pipeline.train.plan import TrainPlan

log = logging.getLogger(__name__)


def load_split(plan: TrainPlan, t: TrainConfig, split: str, hs_dtype: Any) -> Any:
    """The ``train`` or ``val`` rows (``train.val_fraction`` of them are held out), their
    hidden states read from extract's files, or online from the stage's vLLM server."""
    from eagle3_pipeline.compat.speculators import (
        online_hidden_states_dataset,
        strict_hidden_states_dataset,
    )

    if plan.online is not None:
        import torch

        ep = Endpoint.from_env()
        return online_hidden_states_dataset(
            plan.paths.prepared,
            split,
            1.0 - t.val_fraction,
            t.tokens_per_step,
            hs_dtype,
            endpoint=ep.url,
            api_key=ep.api_key,
            model=ep.model,
            stored_dtype=getattr(torch, plan.online.dtype),
            concurrency=plan.online.concurrency,
        )
    return strict_hidden_states_dataset(
        plan.paths.prepared,
        plan.paths.hidden_states,
        split,
        1.0 - t.val_fraction,
        t.tokens_per_step,
        hs_dtype,
    )


def epoch_batches(ds: Any, t: TrainConfig, seed: int, d: Dist, epoch: int) -> list[list[int]]:
    """This rank's packed batches (row ids) of ``epoch``; the same number on every rank."""
    from speculators.train.distributed_batch_sampler import (
        MultipackDistributedBatchSamplerV2,
    )

    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=t.tokens_per_step,
        lengths=ds.approx_lengths,
        num_replicas=d.world,
        rank=d.rank,
        seed=seed,
    )
    sampler.set_epoch(epoch)
    batches = [[int(i) for i in b] for b in sampler]
    if d.world > 1:
        # every rank must take the same number of steps (DDP's gradient all-reduce and
        # FSDP's all-gathers are collectives); the sampler packs in rounds of one batch
        # per rank, so this only trims if it ever left a rank short
        n = all_reduce_ints([len(batches)], d, op="min")[0]
        if n < len(batches):
            log.warning(
                "rank %d: %d of its %d batches dropped to match the other ranks",
                d.rank,
                len(batches) - n,
                len(batches),
            )
        batches = batches[:n]
    return batches


def make_loader(
    ds: Any, batches: list[list[int]], t: TrainConfig, spec: TargetSpec, hs_dtype: Any
) -> Any:
    """Collated, shifted batches of ``batches`` (in this process: no loader workers)."""
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import CollateFn
    from torch.utils.data import DataLoader

    collate = CollateFn(
        t.tokens_per_step,
        spec.hidden_size,
        num_target_layers=len(spec.aux_layer_ids),
        dtype=hs_dtype,
        preprocess=shift_batch,
    )
    return DataLoader(ds, batch_sampler=batches, collate_fn=collate, num_workers=0)
