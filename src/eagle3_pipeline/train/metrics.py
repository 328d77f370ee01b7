"""Numbers of a run: per-step sums into loss and accuracies, and metrics/train.json.

speculators' forward returns ``*_sum`` / ``*_total`` counts rather than means, so that
packs of different sizes and several ranks add up exactly: they are summed over batches
and ranks first and divided once (:func:`summarize`).
"""

from __future__ import annotations

import resource
from typing import TYPE_CHECKING, Any

from eagle3_pipeline.core.config import Config
from eagle3_pipeline.train.distributed import dist_backend, local_fraction

if TYPE_CHECKING:
    from eagle3_pipeline.train.loop import DraftTrainer


def summarize(sums: dict[str, float], k: int) -> dict[str, Any]:
    """Loss and per-position accuracies from speculators' ``*_sum`` / ``*_total`` counts."""

    def ratio(name: str) -> float:
        tot = sums.get(f"{name}_total", 0.0)
        return sums.get(f"{name}_sum", 0.0) / tot if tot > 0 else 0.0

    return {
        "loss": ratio("loss"),
        "loss_per_position": [ratio(f"loss_{i}") for i in range(k)],
        "accuracy_per_position": [ratio(f"full_acc_{i}") for i in range(k)],
        "conditional_accuracy_per_position": [ratio(f"cond_acc_{i}") for i in range(k)],
    }


def accumulate(acc: dict[str, float], metrics: dict[str, Any]) -> None:
    """Add one forward's ``*_sum`` / ``*_total`` counts to ``acc``."""
    for key, value in metrics.items():
        if key.endswith(("_sum", "_total")):
            acc[key] = acc.get(key, 0.0) + float(value)


def peak_memory_mib(device: str) -> float:
    """Peak CUDA memory allocated by this process, or its peak RSS on CPU."""
    if device == "cuda":
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rate(amount: float, seconds: float) -> float:
    return amount / seconds if seconds else 0


def run_metrics(cfg: Config, trainer: DraftTrainer, result: dict[str, Any],
                draft_config: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """metrics/train.json as rank 0 sees it (the stage adds the launcher and GPU reading).

    ``result``: :meth:`DraftTrainer.run`'s; ``draft_config``: the saved draft's config."""
    plan, d = trainer.plan, trainer.d
    val = result["val"]
    untrained = trainer.val_loss_untrained
    return {
        "val_loss": val["loss"],
        "val_loss_untrained": untrained,
        "val_loss_ratio": val["loss"] / untrained if untrained else None,
        "val_accuracy_per_position": val["accuracy_per_position"],
        "val_conditional_accuracy_per_position": val["conditional_accuracy_per_position"],
        "val_untrained_accuracy_per_position":
            (trainer.val_untrained or {}).get("accuracy_per_position"),
        "steps": trainer.global_step,
        "total_steps": trainer.total_steps,
        "steps_this_run": result["steps_this_run"],
        "resumed": result["steps_this_run"] < trainer.global_step,
        "steps_per_s": _rate(result["steps_this_run"], result["train_s"]),
        "tokens_per_s": _rate(result["tokens_this_run"], result["train_s"]),
        "wall_s": wall_s,
        "peak_memory_mib": peak_memory_mib(plan.runtime.device),
        "device": plan.runtime.device,
        "dtype": plan.runtime.dtype,
        "attn_implementation": trainer.attn,
        "loss_implementation": trainer.loss_impl,
        "world_size": d.world,
        "parallel": trainer.parallel,
        "parallel_reason": plan.parallel_reason if d.world > 1 else "one process",
        "distributed_backend": dist_backend(plan.runtime.device) if d.world > 1 else None,
        "data_parallel": trainer.sharding,
        "hardware": cfg.hardware.name,
        "model": cfg.model.name,
        "draft_shape": plan.shape.to_dict(),
        "draft_vocab_size": cfg.train.draft_vocab_size,
        "recipe": {"optimizer": str(cfg.train.optimizer), "lr": cfg.train.lr,
                   "muon_lr": cfg.train.muon_lr, "scheduler": str(cfg.train.scheduler),
                   "norm_before_fc": cfg.train.draft.norm_before_fc,
                   "fc_norm": cfg.train.draft.fc_norm, "norm_output": cfg.train.draft.norm_output,
                   "ttt_step_loss_decay": cfg.train.ttt_step_loss_decay},
        "required_tokens": plan.required_tokens,
        "aux_layer_ids": draft_config.get("eagle_aux_hidden_state_layer_ids"),
        "trainable_parameters": sum(
            p.numel() for p in trainer.model.parameters() if p.requires_grad),
        # share of the parameters rank 0 holds: 1 unsharded, ~1/world under FSDP
        "local_parameter_fraction": local_fraction(trainer.model),
        "train_rows": len(trainer.train_ds),
        "val_rows": len(trainer.val_ds),
    }
