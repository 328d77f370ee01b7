"""One training run in this process: the whole run on CPU, or one torchrun rank.

It runs a plan (:func:`~eagle3_pipeline.train.plan.plan_training`, made once per process by
the caller) and records what it did: the settings come from the plan, never from the
stage's input view again."""

from __future__ import annotations

import resource
import time
from typing import Any

from eagle3_pipeline.runtime.gpu import GpuRelease
from eagle3_pipeline.train.distributed import (
    close_distributed,
    dist_backend,
    init_distributed,
    local_fraction,
)
from eagle3_pipeline.train.loop import DraftTrainer
from eagle3_pipeline.train.plan import TrainPlan
from eagle3_pipeline.train.record import InitFrom, TrainRecord
from eagle3_pipeline.train.save import save_draft
from eagle3_pipeline.train.state import full_state_dict

# ``gpu`` in the record the workers return: the stage replaces it with NVML's reading
NOT_READ_BY_WORKERS = "not read yet: the train stage reads NVML once its workers exited"


def train(plan: TrainPlan, progress: bool = True) -> TrainRecord | None:
    """Train (or resume) the draft; on rank 0 write data/draft and the curves (dvclive).

    Returns the run's record as rank 0 sees it (:func:`run_record`), None on other ranks.
    """
    t_start = time.perf_counter()
    d = init_distributed(plan.runtime.device)
    try:
        trainer = DraftTrainer(plan, d, progress=progress)
        result = trainer.run()
        # under FSDP a gather (every rank), rank 0 saves; else the model's own state dict
        full = full_state_dict(trainer.model, "fsdp") if trainer.parallel == "fsdp" else None
        if not d.main:
            return None
        chosen = trainer.selection
        if not chosen.is_last_best() and chosen.best_weights:
            # an earlier epoch's draft scored better (train.select): it is the one written
            if full is not None:
                full.update(chosen.best_weights)
            else:
                trainer.model.load_state_dict(chosen.best_weights, strict=False)
        config = save_draft(
            trainer.model, plan.paths.draft, plan.train.speculative_tokens, state_dict=full
        )
        if trainer.curves is not None:
            trainer.curves.finish(trainer.history, trainer.k, float(result["val"]["loss"]))
        return run_record(trainer, result, config, time.perf_counter() - t_start)
    finally:
        close_distributed(d)


def peak_memory_mib(device: str) -> float:
    """Peak CUDA memory allocated by this process, or its peak RSS on CPU."""
    if device == "cuda":
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rate(amount: float, seconds: float) -> float:
    return amount / seconds if seconds else 0


def run_record(
    trainer: DraftTrainer,
    result: dict[str, Any],
    draft_config: dict[str, Any],
    wall_s: float,
) -> TrainRecord:
    """The details (``paths.details``/train.json) as rank 0 sees them, field by field.

    The stage completes it (:func:`eagle3_pipeline.train.launch.run_training`): torchrun's
    ``launcher`` and NVML's reading once the workers exited, which no worker can take
    (``gpu`` says so until then, ``gpu_released`` is None).
    ``result``: :meth:`DraftTrainer.run`'s; ``draft_config``: the saved draft's config."""
    plan, d = trainer.plan, trainer.d
    val = result["val"]
    loss = float(val["loss"])
    untrained = trainer.val_loss_untrained
    untrained_acc = (trainer.val_untrained or {}).get("accuracy_per_position")
    aux = draft_config.get("eagle_aux_hidden_state_layer_ids")
    return TrainRecord(
        val_loss=loss,
        val_loss_untrained=untrained,
        val_loss_ratio=loss / untrained if untrained else None,
        val_accuracy_per_position=[float(a) for a in val["accuracy_per_position"]],
        val_conditional_accuracy_per_position=[
            float(a) for a in val["conditional_accuracy_per_position"]
        ],
        val_untrained_accuracy_per_position=(
            [float(a) for a in untrained_acc] if untrained_acc is not None else None
        ),
        steps=trainer.global_step,
        total_steps=trainer.total_steps,
        steps_this_run=int(result["steps_this_run"]),
        resumed=result["steps_this_run"] < trainer.global_step,
        steps_per_s=_rate(result["steps_this_run"], result["train_s"]),
        tokens_per_s=_rate(result["tokens_this_run"], result["train_s"]),
        wall_s=wall_s,
        peak_memory_mib=peak_memory_mib(plan.runtime.device),
        device=plan.runtime.device,
        dtype=plan.runtime.dtype,
        dtype_why=plan.runtime.dtype_why,
        attn_implementation=trainer.attn,
        loss_implementation=trainer.loss_impl,
        world_size=d.world,
        parallel=trainer.parallel,
        parallel_reason=plan.parallel_reason if d.world > 1 else "one process",
        distributed_backend=dist_backend(plan.runtime.device) if d.world > 1 else None,
        data_parallel=list(trainer.sharding),
        hardware=plan.hardware,
        target=plan.target,
        draft_shape=plan.shape,
        draft_vocab_size=plan.train.draft_vocab_size,
        recipe=plan.recipe,
        required_tokens=dict(plan.required_tokens),
        aux_layer_ids=[int(i) for i in aux] if aux is not None else None,
        trainable_parameters=sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        # share of the parameters rank 0 holds: 1 unsharded, ~1/world under FSDP
        local_parameter_fraction=local_fraction(trainer.model),
        train_rows=len(trainer.train_ds),
        val_rows=len(trainer.val_ds),
        init_from=(
            InitFrom(path=str(plan.init.path), format=plan.init.format, sha256=plan.init.sha256)
            if plan.init is not None
            else None
        ),
        hidden_states="online" if plan.online is not None else "offline",
        checkpoint=trainer.selection.choice(),
        gpu=GpuRelease(mode="not applicable", reason=NOT_READ_BY_WORKERS),
        gpu_released=None,
    )
