"""The draft's optimizer(s) and learning-rate schedule (``train.optimizer``, ``train.scheduler``).

Why a group: speculators' Muon recipe is two torch optimizers -- ``torch.optim.Muon`` over
the 2-D weight matrices and AdamW over everything else (norms, biases, embeddings), split
by speculators' own ``split_named_params_for_muon`` so both recipes put each parameter in
the same place. The training loop and the resumable state see one object that steps,
zeroes, saves and restores all of them, and one schedule applied to each.
"""

from __future__ import annotations

from typing import Any

from eagle3_pipeline.core.config import TrainConfig

# speculators 0.9's own Muon settings (its OptimizerArgs defaults), so ``optimizer=muon``
# is its recipe: momentum, the Muon group's weight decay, Newton-Schulz steps, and the
# learning-rate adjustment that matches AdamW's update RMS (so one lr serves both groups).
MUON_DEFAULTS: dict[str, Any] = {
    "momentum": 0.95,
    "weight_decay": 0.1,
    "ns_steps": 5,
    "adjust_lr_fn": "match_rms_adamw",
}


class OptimizerGroup:
    """Several torch optimizers used as one (``param_groups[0]`` is the first's)."""

    def __init__(self, optimizers: list[Any]) -> None:
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for o in self.optimizers for g in o.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def state_dict(self) -> dict[str, Any]:
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state["optimizers"]
        if len(saved) != len(self.optimizers):
            raise ValueError(
                f"state holds {len(saved)} optimizers, this run has {len(self.optimizers)}"
            )
        for o, s in zip(self.optimizers, saved, strict=True):
            o.load_state_dict(s)


class SchedulerGroup:
    """One schedule per optimizer of an :class:`OptimizerGroup`, stepped together."""

    def __init__(self, schedulers: list[Any]) -> None:
        self.schedulers = schedulers

    def step(self) -> None:
        for s in self.schedulers:
            s.step()

    def state_dict(self) -> dict[str, Any]:
        return {"schedulers": [s.state_dict() for s in self.schedulers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for s, saved in zip(self.schedulers, state["schedulers"], strict=True):
            s.load_state_dict(saved)


def _schedule(optimizer: Any, t: TrainConfig, total_steps: int) -> Any:
    import torch
    from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

    warmup = int(total_steps * t.warmup_ratio)
    if t.scheduler == "cosine":
        return get_cosine_schedule_with_warmup(optimizer, warmup, total_steps)
    if t.scheduler == "linear":
        return get_linear_schedule_with_warmup(optimizer, warmup, total_steps)
    # "none", the remaining choice of the schema's Enum
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _s: 1.0)


def build_optimizer(
    model: Any, t: TrainConfig, total_steps: int, dtype: str = "float32"
) -> tuple[OptimizerGroup, SchedulerGroup]:
    """``train.optimizer`` over the trainable parameters, and ``train.scheduler``'s
    schedule for each optimizer; Muon's Newton-Schulz iteration on a CPU computes in the
    training's ``dtype`` (``compat/torch_muon.py``)."""
    import torch

    if t.optimizer == "muon":
        from speculators.train.optimizers import split_named_params_for_muon

        from eagle3_pipeline.compat.torch_muon import newton_schulz_on_cpu

        # float32 where the run is float32 (bf16 matmuls crawl on a CPU without native
        # bf16), torch's bf16 where the run is bf16 (AMX: several times faster)
        newton_schulz_on_cpu(dtype)
        muon, rest = split_named_params_for_muon(model)
        opts: list[torch.optim.Optimizer] = []
        if muon:
            opts.append(
                torch.optim.Muon([p for _, p in muon], lr=t.muon_lr or t.lr, **MUON_DEFAULTS)
            )
        if rest:
            opts.append(
                torch.optim.AdamW([p for _, p in rest], lr=t.lr, weight_decay=t.weight_decay)
            )
    else:
        params = [p for p in model.parameters() if p.requires_grad]
        opts = [torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)]
    return OptimizerGroup(opts), SchedulerGroup([_schedule(o, t, total_steps) for o in opts])
