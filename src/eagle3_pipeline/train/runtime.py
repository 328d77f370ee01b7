"""Where and how the draft trains: device, compute dtype, attention and loss kernels,
worker count and the parallel mode (one process, DDP or FSDP2).

Defaults follow the hardware profile; ``train.*`` overrides them. CPU trains with sdpa
attention and the eager loss, in the precision preflight chose for the target
(:mod:`eagle3_pipeline.runtime.precision`: bf16 for a real target on a CPU with native
bf16, else float32). CUDA trains in ``hardware.train_dtype``. A bf16 run keeps float32
master weights and optimizer state under bf16 autocast (as speculators does on GPUs);
CUDA's attention and loss kernels are decided on the worker, which can see the GPU (see
:mod:`eagle3_pipeline.train.loop`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eagle3_pipeline.draft.shape import DraftShape
from eagle3_pipeline.runtime.precision import Precision, rule_precision, set_by
from eagle3_pipeline.targets.adapter import TargetSpec
from eagle3_pipeline.train.view import TrainInputs


@dataclass(frozen=True)
class Runtime:
    device: str  # cpu | cuda
    dtype: str  # float32 | bfloat16 (compute dtype; weights stay float32)
    attn_implementation: str | None  # None: decided on the worker (needs the GPU)
    loss_implementation: str | None
    world_size: int  # worker processes (GPUs) on this node
    parallel: str = "none"  # none (one process) | ddp | fsdp; set by plan_training
    nodes: int = 1  # hardware.nodes: one torchrun agent on each
    dtype_why: str = ""  # why that dtype (the key that set it, or the rule that chose it)

    @property
    def launched(self) -> bool:
        """Whether the stage runs the workers under torchrun (always on CUDA, so that it
        can read NVML after they exited; on CPU when ``train.nproc`` > 1 or over nodes)."""
        return self.device == "cuda" or self.world_size > 1 or self.nodes > 1


# auto picks FSDP when DDP's per-GPU replica (weights + grads + AdamW state + frozen
# weights) would take more than this share of the profile's GPU memory: the rest is for
# activations of tokens_per_step tokens through the TTT unroll and the CUDA context.
DDP_MEMORY_SHARE = 0.6


def resolve_runtime(cfg: TrainInputs) -> Runtime:
    """Device, dtype, attention, loss and worker count: ``train.*`` overrides, else the
    hardware profile. The parallel mode needs the draft's shape: :func:`choose_parallel`.
    The settings were checked when the config was composed (``core.config.rules.validate``)."""
    t, hw = cfg.train, cfg.hardware
    device = t.device or hw.device
    if t.dtype is not None:
        precision = set_by("train.dtype", t.dtype)
    elif device == "cuda":
        precision = Precision(str(hw.train_dtype), f"hardware.train_dtype of hardware={hw.name}")
    else:  # preflight's choice for the target
        precision = rule_precision(device, cfg.model.tiny is not None, cfg.paths.precision)
    attn = t.attn_implementation or ("sdpa_packed" if device == "cpu" else None)
    loss_impl = t.loss_implementation or ("cpu" if device == "cpu" else None)
    if device != "cuda":
        world = t.nproc or 1
    else:
        world = t.nproc or max(1, hw.gpu_count)
    return Runtime(
        device,
        precision.dtype,
        attn,
        loss_impl,
        world,
        nodes=max(1, hw.nodes),
        dtype_why=precision.why,
    )


def choose_parallel(
    cfg: TrainInputs, shape: DraftShape, spec: TargetSpec, world: int
) -> tuple[str, str]:
    """``(mode, reason)``: none for one process, else ``train.parallel`` or, for auto,
    fsdp when the draft is large, ddp otherwise.

    Large: the trainable parameter count (:func:`draft.estimate_parameters`) reaches
    ``train.fsdp_min_params``, or DDP's per-GPU footprint -- 16 bytes per trainable
    parameter (fp32 weight, gradient, two AdamW moments) plus 4 per frozen one (the
    target's embeddings, its lm_head rows, norms) -- exceeds ``DDP_MEMORY_SHARE`` of
    ``hardware.gpu_memory_mib`` (CUDA profiles that state it).
    """
    from eagle3_pipeline.draft.shape import estimate_parameters

    t, hw = cfg.train, cfg.hardware
    if world <= 1:
        return "none", "one process"
    if t.parallel != "auto":
        return t.parallel, f"train.parallel={t.parallel}"
    trainable, frozen = estimate_parameters(
        shape, len(spec.aux_layer_ids), t.draft_vocab_size, spec.vocab_size, t.draft
    )
    if trainable >= t.fsdp_min_params:
        return "fsdp", (
            f"auto: {trainable:,} trainable parameters >= "
            f"train.fsdp_min_params={t.fsdp_min_params:,}"
        )
    ddp_mib = (16 * trainable + 4 * frozen) / 2**20
    device = t.device or hw.device
    if device == "cuda" and hw.gpu_memory_mib and ddp_mib > DDP_MEMORY_SHARE * hw.gpu_memory_mib:
        return "fsdp", (
            f"auto: a DDP replica needs ~{ddp_mib:,.0f} MiB per GPU, more than "
            f"{DDP_MEMORY_SHARE:.0%} of hardware.gpu_memory_mib={hw.gpu_memory_mib}"
        )
    return "ddp", (f"auto: {trainable:,} trainable parameters, ~{ddp_mib:,.0f} MiB per DDP replica")


def cuda_attention(device: Any, shape: DraftShape) -> str:
    """The attention kernel on this worker's GPU: flex attention, sdpa where flex's
    backward fails (head_dim > 128 on sm_12x)."""
    import torch

    major, _ = torch.cuda.get_device_capability(device)
    if major >= 12 and shape.head_dim > 128:
        return "sdpa"  # flex_attention backward exceeds shared memory on sm_12x
    return "simple_flex_attention"


def cuda_loss() -> str:
    """The fused loss when Triton is present, else the eager one."""
    import importlib.util

    return "fused" if importlib.util.find_spec("triton") is not None else "eager"
