"""The EAGLE-3 draft's training: one loop for CPU, one GPU and torchrun (DDP or FSDP2).

Design decision -- a lean loop over speculators' parts, not speculators' ``Trainer``:
everything that defines what the draft learns is speculators' code, used as is: the
``Eagle3DraftModel`` (its TTT unrolled forward, loss and per-position accuracy), its config
and vocabulary mapping, its ``ArrowDataset`` + ``CollateFn`` + multipack sampler +
``shift_batch`` reading the rows and ``hs_{i}`` files. What this module owns is the loop
around them, about a hundred lines, because the ``Trainer`` gets in the way of each
requirement of this stage: it does not run on CPU without four patches (device 0,
accelerator synchronize, autocast type, checkpoint device); it checkpoints per epoch
into its own directory layout, without the RNG state or a config fingerprint, so a DVC
``persist`` directory left by other params would be resumed silently; it has no hook for
training-only noise; and its metrics go to its loggers, not to files DVC tracks. The
compat module still carries the patches that make its ``Trainer`` run on CPU, and
``bench/train.py`` measures this loop's step against it on the same data and draft.

Devices: CPU trains in float32 with sdpa attention and the eager loss, in this process,
no worker processes. CUDA trains with float32 master weights under bfloat16 autocast (as
speculators does), flex attention (sdpa where flex's backward fails: head_dim > 128 on
sm_12x) and the fused loss when Triton is present; it always runs in worker processes
started by ``torchrun`` (the stage launches it), so that the stage can read NVML after
the workers have exited.

Several workers (``torchrun``, started by the stage): the backend follows the device
(nccl on CUDA, gloo on CPU; ``train.nproc=N`` runs N CPU workers, which is how the
multi-process path is tested on a machine without GPUs). Each rank reads its own share
of every epoch's packed batches (speculators' multipack sampler, ``num_replicas`` =
world size); ``train.parallel`` picks DDP or FSDP2 (``fully_shard`` on each decoder layer
and on the draft, speculators' ``apply_fully_sharded`` recipe; ``auto`` = FSDP for large
drafts, see :func:`choose_parallel`). FSDP2 runs on CPU with gloo in torch 2.14 (checked:
all-gather, reduce-scatter, clip_grad_norm_ on DTensors and the full state-dict
gather/scatter of ``torch.distributed.checkpoint.state_dict``), so the FSDP path is tested
on CPU too. Under FSDP the resumable state and the saved draft are gathered into a full
state dict on rank 0 (a collective: every rank takes part, rank 0 writes).

Resume: ``data/train_state/state.pt`` holds the trainable weights, optimizer, scheduler,
step, RNG states and a fingerprint of everything that shapes the run; a state whose
fingerprint differs, or that finished, is ignored. The noise is drawn from a generator
seeded by (seed, step), so a resumed run draws the same noise as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import random
import resource
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config import Config, ConfigError, metrics_path
from eagle3_pipeline.core.io import (
    atomic_dir,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
)
from eagle3_pipeline.draft.shape import (
    DraftShape,
    build_draft,
    build_vocab_mapping,
    check_train_config,
    load_token_freq,
    special_token_ids,
)
from eagle3_pipeline.targets.adapter import TargetSpec, load_target_spec

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"


class TrainingError(RuntimeError):
    """Bad training input or a refused setting; the message names the file or key."""


class SimulatedFailure(RuntimeError):
    """Raised by ``train.fail_after_steps`` (tests of resume)."""


# --------------------------------------------------------------------------- paths, runtime


@dataclass(frozen=True)
class TrainPaths:
    target_json: Path
    prepared: Path
    hidden_states: Path
    draft: Path
    state: Path
    metrics: Path
    plots: Path

    @classmethod
    def from_config(cls, cfg: Config) -> TrainPaths:
        paths = cfg.paths
        return cls(
            target_json=Path(paths.target) / "target.json",
            prepared=Path(paths.prepared),
            hidden_states=Path(paths.hidden_states),
            draft=Path(paths.draft),
            state=Path(paths.train_state),
            metrics=metrics_path(cfg, "train"),
            plots=Path(paths.plots) / "train",
        )


@dataclass(frozen=True)
class Runtime:
    device: str  # cpu | cuda
    dtype: str  # float32 | bfloat16 (compute dtype; weights stay float32)
    attn_implementation: str | None  # None: decided on the worker (needs the GPU)
    loss_implementation: str | None
    world_size: int  # worker processes (GPUs) on this node
    parallel: str = "none"  # none (one process) | ddp | fsdp; set by plan_training

    @property
    def launched(self) -> bool:
        """Whether the stage runs the workers under torchrun (always on CUDA, so that it
        can read NVML after they exited; on CPU when ``train.nproc`` > 1)."""
        return self.device == "cuda" or self.world_size > 1


PARALLEL_CHOICES = ("auto", "ddp", "fsdp")
# auto picks FSDP when DDP's per-GPU replica (weights + grads + AdamW state + frozen
# weights) would take more than this share of the profile's GPU memory: the rest is for
# activations of tokens_per_step tokens through the TTT unroll and the CUDA context.
DDP_MEMORY_SHARE = 0.6


def resolve_runtime(cfg: Config) -> Runtime:
    """Device, dtype, attention, loss and worker count: ``train.*`` overrides, else the
    hardware profile. The parallel mode needs the draft's shape: :func:`plan_training`."""
    t, hw = cfg.train, cfg.hardware
    device = t.device or hw.device
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"train.device={device!r} is not cpu or cuda")
    dtype = t.dtype or (hw.train_dtype if device == "cuda" else "float32")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"train.dtype={dtype!r} is not float32, bfloat16 or float16")
    attn = t.attn_implementation or ("sdpa" if device == "cpu" else None)
    if attn not in (None, "sdpa", "eager", "simple_flex_attention"):
        raise ConfigError(f"train.attn_implementation={attn!r} is not sdpa, eager or "
                          "simple_flex_attention")
    if device == "cpu" and attn == "simple_flex_attention":
        raise ConfigError("train.attn_implementation=simple_flex_attention has no CPU backward")
    loss_impl = t.loss_implementation or ("eager" if device == "cpu" else None)
    if loss_impl not in (None, "eager", "fused"):
        raise ConfigError(f"train.loss_implementation={loss_impl!r} is not eager or fused")
    if t.nproc is not None and t.nproc < 1:
        raise ConfigError(f"train.nproc={t.nproc} must be >= 1 (or null)")
    if device == "cuda":
        world = t.nproc or max(1, hw.gpu_count)
        if hw.gpu_count and world > hw.gpu_count:
            raise ConfigError(f"train.nproc={world} exceeds hardware.gpu_count={hw.gpu_count} "
                              "(one worker per GPU)")
    else:
        world = t.nproc or 1
    if t.parallel not in PARALLEL_CHOICES:
        raise ConfigError(f"train.parallel={t.parallel!r} is not auto, ddp or fsdp")
    return Runtime(device, dtype, attn, loss_impl, world)


def choose_parallel(cfg: Config, shape: DraftShape, spec: TargetSpec,
                    world: int) -> tuple[str, str]:
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
    trainable, frozen = estimate_parameters(shape, len(spec.aux_layer_ids),
                                            t.draft_vocab_size, spec.vocab_size)
    if trainable >= t.fsdp_min_params:
        return "fsdp", (f"auto: {trainable:,} trainable parameters >= "
                        f"train.fsdp_min_params={t.fsdp_min_params:,}")
    ddp_mib = (16 * trainable + 4 * frozen) / 2**20
    device = t.device or hw.device
    if device == "cuda" and hw.gpu_memory_mib and ddp_mib > DDP_MEMORY_SHARE * hw.gpu_memory_mib:
        return "fsdp", (f"auto: a DDP replica needs ~{ddp_mib:,.0f} MiB per GPU, more than "
                        f"{DDP_MEMORY_SHARE:.0%} of hardware.gpu_memory_mib={hw.gpu_memory_mib}")
    return "ddp", (f"auto: {trainable:,} trainable parameters, ~{ddp_mib:,.0f} MiB per "
                   "DDP replica")


def target_dir(spec: TargetSpec) -> Path:
    """The local target directory (embeddings, lm_head, final norm are read from it)."""
    if not spec.path:
        raise TrainingError("target.json has no local path: training needs the target's "
                            "embedding, lm_head and final-norm weights on this machine")
    path = Path(spec.path)
    if not (path / "config.json").is_file():
        raise TrainingError(f"{path}: target directory has no config.json (target.json path)")
    return path


# --------------------------------------------------------------------------- input checks


def _norm_target(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    return {"name": value} if value is not None else {}


def check_hidden_states(hs_dir: Path, spec: TargetSpec, n_rows: int) -> dict[str, Any]:
    """Refuse hidden states made from another target, revision or layer set.

    Reads ``manifest.json`` (written by the extract stage) and the header of the first
    file: the layer ids must be target.json's aux ids, the target's name / hub id /
    revision must match where both sides record them, and the tensors must be
    ``[seq, n_aux + 1, hidden]`` with the target's hidden size.
    """
    from eagle3_pipeline.targets.adapter import read_safetensors_header

    manifest_path = hs_dir / "manifest.json"
    if not manifest_path.is_file():
        raise TrainingError(f"{manifest_path}: not found (run the extract stage)")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TrainingError(f"{manifest_path}: not valid JSON ({exc})") from None
    layers = manifest.get("layers", manifest.get("aux_layer_ids"))
    if isinstance(layers, dict):
        layers = layers.get("aux", layers.get("aux_layer_ids"))
    if layers is None or [int(k) for k in layers] != list(spec.aux_layer_ids):
        raise TrainingError(
            f"{manifest_path}: hidden states of layers {layers}, but target.json's aux layer "
            f"ids are {spec.aux_layer_ids}: rerun the extract stage"
        )
    recorded = _norm_target(manifest.get("target"))
    for key in ("revision",):
        if key in manifest and key not in recorded:
            recorded[key] = manifest[key]
    mine = {"name": spec.name, "hub_id": spec.hub_id, "revision": spec.revision,
            "num_layers": spec.num_layers, "hidden_size": spec.hidden_size,
            "vocab_size": spec.vocab_size}
    for key, value in mine.items():
        theirs = recorded.get(key)
        if key in recorded and theirs != value:
            raise TrainingError(
                f"{manifest_path}: hidden states from target {key}={theirs!r}, "
                f"but target.json has {key}={value!r}: rerun the extract stage"
            )
    first = hs_dir / "hs_0.safetensors"
    if not first.is_file():
        raise TrainingError(f"{first}: not found (hidden states for prepared row 0)")
    header = read_safetensors_header(first)
    shape = header.get("hidden_states", {}).get("shape")
    want = [len(spec.aux_layer_ids) + 1, spec.hidden_size]
    if not shape or len(shape) != 3 or shape[1:] != want:
        raise TrainingError(
            f"{first}: hidden_states shape {shape}, expected [seq, {want[0]}, {want[1]}] "
            f"({len(spec.aux_layer_ids)} aux layers + final state, hidden {spec.hidden_size})"
        )
    missing = [i for i in range(n_rows) if not (hs_dir / f"hs_{i}.safetensors").is_file()]
    if missing:
        raise TrainingError(
            f"{hs_dir}: no hidden states for {len(missing)} of {n_rows} prepared rows "
            f"(first: hs_{missing[0]}.safetensors)"
        )
    return manifest


def count_rows(prepared: Path) -> int:
    from datasets import load_from_disk

    if not prepared.is_dir():
        raise TrainingError(f"{prepared}: prepared dataset not found (run the prepare stage)")
    ds = load_from_disk(str(prepared))
    for col in ("input_ids", "loss_mask", "seq_len"):
        if col not in ds.column_names:
            raise TrainingError(f"{prepared}: column {col!r} missing (have {ds.column_names})")
    return len(ds)


@dataclass
class Plan:
    """Everything checked before any training starts (the stage checks it before launching)."""

    spec: TargetSpec
    shape: DraftShape
    runtime: Runtime
    paths: TrainPaths
    n_rows: int
    required_tokens: dict[str, int]
    fingerprint: str
    parallel_reason: str = "one process"


def plan_training(cfg: Config, paths: TrainPaths | None = None) -> Plan:
    paths = paths or TrainPaths.from_config(cfg)
    spec = load_target_spec(paths.target_json)
    shape = check_train_config(cfg.train, spec)
    runtime = resolve_runtime(cfg)
    nodes = max(1, cfg.hardware.nodes) if runtime.device == "cuda" else 1
    mode, reason = choose_parallel(cfg, shape, spec, runtime.world_size * nodes)
    runtime = replace(runtime, parallel=mode)
    tdir = target_dir(spec)
    n_rows = count_rows(paths.prepared)
    n_val = n_rows - int(n_rows * (1 - cfg.train.val_fraction))
    if n_val < 1 or n_rows - n_val < 1:
        raise TrainingError(
            f"{paths.prepared}: {n_rows} rows cannot be split with "
            f"train.val_fraction={cfg.train.val_fraction}"
        )
    check_hidden_states(paths.hidden_states, spec, n_rows)
    required = special_token_ids(tdir)
    fp = fingerprint(cfg, spec, shape, n_rows, runtime)
    return Plan(spec, shape, runtime, paths, n_rows, required, fp, reason)


def fingerprint(cfg: Config, spec: TargetSpec, shape: DraftShape, n_rows: int,
                runtime: Runtime) -> str:
    """What a resumable state must match: every setting that changes the trajectory."""
    t = asdict(cfg.train)
    for volatile in ("fail_after_steps",):
        t.pop(volatile)
    blob = json.dumps(
        {"train": t, "seed": cfg.seed, "target": spec.to_dict(), "shape": shape.to_dict(),
         "rows": n_rows, "runtime": asdict(runtime)},
        sort_keys=True, default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- distributed


@dataclass
class Dist:
    rank: int = 0
    local_rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str) -> Dist:
    """Join the torchrun group when started by torchrun, else a single process."""
    import torch
    import torch.distributed as dist

    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Dist()
    d = Dist(int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]),
             int(os.environ["WORLD_SIZE"]))
    if device == "cuda":
        torch.cuda.set_device(d.local_rank)
    dist.init_process_group(backend=dist_backend(device))
    return d


def dist_backend(device: str) -> str:
    """The process-group backend follows the device: nccl on CUDA, gloo on CPU."""
    return "nccl" if device == "cuda" else "gloo"


def _all_reduce_ints(values: list[int], d: Dist, op: str = "sum") -> list[int]:
    """An all-reduce of small integer vectors (gloo and nccl; CPU tensors for gloo)."""
    if d.world <= 1:
        return list(values)
    import torch
    import torch.distributed as dist

    device = "cpu" if dist.get_backend() == "gloo" else f"cuda:{d.local_rank}"
    t = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN}[op])
    return [int(v) for v in t.tolist()]


def _all_reduce(values: dict[str, float], d: Dist, device: Any) -> dict[str, float]:
    if d.world <= 1 or not values:
        return values
    import torch
    import torch.distributed as dist

    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist(), strict=True))


# --------------------------------------------------------------------------- metrics helpers


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


def _accumulate(acc: dict[str, float], metrics: dict[str, Any]) -> None:
    for key, value in metrics.items():
        if key.endswith(("_sum", "_total")):
            acc[key] = acc.get(key, 0.0) + float(value)


def peak_memory_mib(device: str) -> float:
    if device == "cuda":
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --------------------------------------------------------------------------- the loop


@dataclass
class History:
    steps: list[dict[str, Any]] = field(default_factory=list)
    epochs: list[dict[str, Any]] = field(default_factory=list)


class DraftTrainer:
    """One training run (one process, or one torchrun rank)."""

    def __init__(self, cfg: Config, plan: Plan, d: Dist, progress: bool = True) -> None:
        import torch

        self.cfg, self.plan, self.d, self.progress = cfg, plan, d, progress
        self.t = cfg.train
        self.k = cfg.train.speculative_tokens
        rt = plan.runtime
        self.device = torch.device(f"cuda:{d.local_rank}" if rt.device == "cuda" else "cpu")
        self.attn = rt.attn_implementation or self._cuda_attention(plan.shape)
        self.loss_impl = rt.loss_implementation or self._cuda_loss()
        self.autocast_dtype = getattr(torch, rt.dtype) if rt.dtype != "float32" else None
        self.hs_dtype = getattr(torch, rt.dtype)
        # a process group started outside the stage (a hand-run torchrun) still gets DDP
        self.parallel = (rt.parallel if rt.parallel != "none" else "ddp") if d.world > 1 else "none"
        self.model = self._build_model()
        self.train_ds = self._dataset("train")
        self.val_ds = self._dataset("val")
        # the multipack sampler packs each epoch's permutation differently: count them all
        self.steps_per_epoch = [len(self._batches(self.train_ds, e, train=True))
                                for e in range(self.t.epochs)]
        self.total_steps = sum(self.steps_per_epoch)
        if self.t.max_steps is not None:
            self.total_steps = min(self.total_steps, self.t.max_steps)
        self._wrap()
        self._setup_optimizer()
        self.global_step = 0
        self.history = History()
        self.val_loss_untrained: float | None = None
        self.val_untrained: dict[str, Any] | None = None
        self.sharding: list[dict[str, Any]] = []  # per epoch: which rank trained on which rows

    # -- construction

    def _cuda_attention(self, shape: DraftShape) -> str:
        import torch

        major, _ = torch.cuda.get_device_capability(self.device)
        if major >= 12 and shape.head_dim > 128:
            return "sdpa"  # flex_attention backward exceeds shared memory on sm_12x
        return "simple_flex_attention"

    def _cuda_loss(self) -> str:
        import importlib.util

        return "fused" if importlib.util.find_spec("triton") is not None else "eager"

    def _build_model(self) -> Any:
        import torch

        p = self.plan
        torch.manual_seed(self.cfg.seed)
        freq = load_token_freq(p.paths.prepared / "token_freq.pt")
        d2t, t2d = build_vocab_mapping(
            freq, self.t.draft_vocab_size, p.spec.vocab_size, list(p.required_tokens.values())
        )
        model = build_draft(
            p.spec, p.shape, self.k, self.t.draft_vocab_size, d2t, t2d, target_dir(p.spec),
            self.attn, norm_before_residual=self.t.draft.norm_before_residual,
        )
        return model.to(self.device)

    def _dataset(self, split: str) -> Any:
        from eagle3_pipeline.compat.speculators import strict_hidden_states_dataset

        p = self.plan
        return strict_hidden_states_dataset(
            p.paths.prepared, p.paths.hidden_states, split, 1.0 - self.t.val_fraction,
            self.t.tokens_per_step, self.hs_dtype,
        )

    def _batches(self, ds: Any, epoch: int, train: bool) -> list[list[int]]:
        from speculators.train.distributed_batch_sampler import (
            MultipackDistributedBatchSamplerV2,
        )

        sampler = MultipackDistributedBatchSamplerV2(
            batch_max_length=self.t.tokens_per_step, lengths=ds.approx_lengths,
            num_replicas=self.d.world, rank=self.d.rank, seed=self.cfg.seed,
        )
        sampler.set_epoch(epoch if train else 0)
        batches = [[int(i) for i in b] for b in sampler]
        if self.d.world > 1:
            # every rank must take the same number of steps (DDP's gradient all-reduce and
            # FSDP's all-gathers are collectives); the sampler packs in rounds of one batch
            # per rank, so this only trims if it ever left a rank short
            n = _all_reduce_ints([len(batches)], self.d, op="min")[0]
            if n < len(batches):
                log.warning("rank %d: %d of its %d batches dropped to match the other ranks",
                            self.d.rank, len(batches) - n, len(batches))
            batches = batches[:n]
        return batches

    def _loader(self, ds: Any, batches: list[list[int]]) -> Any:
        from speculators.models.eagle3.data import shift_batch
        from speculators.train.data import CollateFn
        from torch.utils.data import DataLoader

        collate = CollateFn(
            self.t.tokens_per_step, self.plan.spec.hidden_size,
            num_target_layers=len(self.plan.spec.aux_layer_ids), dtype=self.hs_dtype,
            preprocess=shift_batch,
        )
        return DataLoader(ds, batch_sampler=batches, collate_fn=collate, num_workers=0)

    def _setup_optimizer(self) -> None:
        import torch
        from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=self.t.lr, weight_decay=self.t.weight_decay)
        warmup = int(self.total_steps * self.t.warmup_ratio)
        if self.t.scheduler == "cosine":
            self.scheduler = get_cosine_schedule_with_warmup(self.optimizer, warmup, self.total_steps)
        elif self.t.scheduler == "linear":
            self.scheduler = get_linear_schedule_with_warmup(self.optimizer, warmup, self.total_steps)
        elif self.t.scheduler == "none":
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _s: 1.0)
        else:
            raise ConfigError(f"train.scheduler={self.t.scheduler!r} is not cosine, linear or none")

    def _wrap(self) -> None:
        """DDP or FSDP2 around the draft (before the optimizer: FSDP replaces parameters)."""
        self.ddp_model = self.model
        if self.parallel == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.d.local_rank] if self.device.type == "cuda" else None
            self.ddp_model = DistributedDataParallel(self.model, device_ids=ids)
        elif self.parallel == "fsdp":
            self._shard()

    def _shard(self) -> None:
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

        full = self.model.state_dict() if self.d.main else {}
        mp = MixedPrecisionPolicy(param_dtype=self.autocast_dtype, reduce_dtype=torch.float32)
        for layer in self.model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(self.model, mp_policy=mp)
        set_model_state_dict(self.model, full, options=StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=True, strict=False))
        del full
        dist.barrier()

    # -- one step

    def _call_kwargs(self) -> dict[str, Any]:
        from speculators.losses import resolve_loss_config

        if getattr(self, "_kwargs", None) is None:
            self._kwargs = {
                "ttt_steps": self.k,
                "ttt_step_loss_decay": self.t.ttt_step_loss_decay,
                "loss_config": resolve_loss_config(self.t.loss, self.loss_impl),
            }
        return self._kwargs

    def _to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        keys = ("hidden_states", "input_ids", "verifier_last_hidden_states", "loss_mask",
                "position_ids", "document_ids")
        return {k: batch[k].to(self.device, non_blocking=True) for k in keys}

    def _autocast(self) -> Any:
        import torch

        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def add_noise(self, batch: dict[str, Any], step: int) -> None:
        """Uniform noise of width ``train.hidden_noise`` on the input hidden states (not
        on the verifier's final state, which defines the targets); seeded per step."""
        import torch

        if self.t.hidden_noise <= 0:
            return
        hs = batch["hidden_states"]
        gen = torch.Generator(device="cpu").manual_seed(
            (self.cfg.seed * 1_000_003 + step * 7919 + self.d.rank) % (2**63)
        )
        noise = (torch.rand(hs.shape, generator=gen, dtype=torch.float32) - 0.5)
        batch["hidden_states"] = hs + (noise * self.t.hidden_noise).to(hs.dtype)

    def train_step(self, batch: dict[str, Any], step: int) -> dict[str, Any]:
        import torch

        self.add_noise(batch, step)
        gb = self._to_device(batch)
        with self._autocast():
            _tokens, loss, metrics = self.ddp_model(**gb, **self._call_kwargs())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.t.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.t.grad_clip)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        sums: dict[str, float] = {}
        _accumulate(sums, metrics)
        sums["tokens_sum"] = float((gb["document_ids"] != -1).sum().item())
        return {"sums": sums, "lr": lr}

    # -- validation

    def validate(self) -> dict[str, Any]:
        import torch

        self.model.eval()
        sums: dict[str, float] = {}
        batches = self._batches(self.val_ds, 0, train=False)
        with torch.no_grad():
            for batch in self._loader(self.val_ds, batches):
                gb = self._to_device(batch)
                with self._autocast():
                    _tokens, _loss, metrics = self.model(**gb, **self._call_kwargs())
                _accumulate(sums, metrics)
        self.model.train()
        sums = _all_reduce(sums, self.d, self.device)
        return summarize(sums, self.k)

    def _record_sharding(self, epoch: int, seen: list[int]) -> None:
        """Per epoch: rows each rank trained on, and how many rows more than one rank
        trained on (0 when the data is sharded)."""
        n = len(self.train_ds)
        counts = [0] * n
        for i in seen:
            counts[i] += 1
        per_rank = [0] * self.d.world
        per_rank[self.d.rank] = len(seen)
        total = _all_reduce_ints(counts + per_rank, self.d)
        counts, per_rank = total[:n], total[n:]
        self.sharding.append({
            "epoch": epoch,
            "rows_per_rank": per_rank,
            "rows_seen": sum(1 for c in counts if c),
            "rows_on_several_ranks": sum(1 for c in counts if c > 1),
            "train_rows": n,
        })

    # -- state

    def full_state_dict(self) -> dict[str, Any]:
        """The draft's full state dict on CPU. Under FSDP a collective: every rank must
        call it; rank 0 gets the gathered tensors, the others an empty dict."""
        if self.parallel != "fsdp":
            return {n: t.detach().cpu() for n, t in self.model.state_dict().items()}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self.model, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))

    def _trainable_state(self) -> dict[str, Any]:
        names = {n for n, p in self.model.named_parameters() if p.requires_grad}
        return {n: t for n, t in self.full_state_dict().items() if n in names}

    def _optimizer_state(self) -> dict[str, Any]:
        """Under FSDP the full (unsharded, FQN-keyed) optimizer state, gathered on rank 0."""
        if self.parallel != "fsdp":
            return self.optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        return get_optimizer_state_dict(self.model, self.optimizer, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))

    def save_state(self, epoch: int, step_in_epoch: int, finished: bool = False) -> None:
        import numpy as np
        import torch

        if self.parallel != "fsdp" and not self.d.main:
            return
        # under FSDP these gather: every rank takes part, rank 0 writes
        model_state, optim_state = self._trainable_state(), self._optimizer_state()
        if not self.d.main:
            return
        state = {
            "fingerprint": self.plan.fingerprint,
            "global_step": self.global_step,
            "epoch": epoch,
            "step_in_epoch": step_in_epoch,
            "total_steps": self.total_steps,
            "finished": finished,
            "model": model_state,
            "optimizer": optim_state,
            "scheduler": self.scheduler.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                    "python": random.getstate()},
            "history": asdict(self.history),
            "sharding": self.sharding,
            "val_untrained": self.val_untrained,
        }
        buf = io.BytesIO()
        torch.save(state, buf)
        atomic_write_bytes(self.plan.paths.state / STATE_FILE, buf.getvalue())
        atomic_write_json(self.plan.paths.state / "state.json", {
            k: state[k] for k in ("fingerprint", "global_step", "epoch", "step_in_epoch",
                                  "total_steps", "finished")
        })

    def load_state(self) -> tuple[int, int] | None:
        """Resume position ``(epoch, step_in_epoch)`` from a matching unfinished state."""
        import numpy as np
        import torch

        path = self.plan.paths.state / STATE_FILE
        if not path.is_file():
            return None
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as exc:  # a corrupt file must not block a fresh run
            log.warning("%s: unreadable (%s); training from scratch", path, exc)
            return None
        if state.get("fingerprint") != self.plan.fingerprint:
            log.info("%s: from other settings; training from scratch", path)
            return None
        if state.get("finished"):
            log.info("%s: a finished run; training again from scratch", path)
            return None
        trainable = {n for n, p in self.model.named_parameters() if p.requires_grad}
        if trainable - set(state["model"]):  # the same verdict on every rank (same file)
            log.warning("%s: weights missing; training from scratch", path)
            return None
        if self.parallel == "fsdp":  # every rank read the full state: each keeps its shard
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            opts = StateDictOptions(full_state_dict=True, strict=False)
            set_model_state_dict(self.model, state["model"], options=opts)
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"],
                                     options=StateDictOptions(full_state_dict=True))
        else:
            self.model.load_state_dict(state["model"], strict=False)
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"]["torch"])
        np.random.set_state(state["rng"]["numpy"])
        random.setstate(state["rng"]["python"])
        self.global_step = int(state["global_step"])
        self.history = History(**state["history"])
        self.sharding = list(state.get("sharding", []))
        self.val_untrained = state.get("val_untrained")
        self.val_loss_untrained = (self.val_untrained or {}).get("loss")
        log.info("resuming from %s at step %d (epoch %d, step %d of it)", path,
                 self.global_step, state["epoch"], state["step_in_epoch"])
        return int(state["epoch"]), int(state["step_in_epoch"])

    # -- the run

    def run(self) -> dict[str, Any]:
        from tqdm.auto import tqdm

        resume = self.load_state()
        if resume is None:
            self.val_untrained = self.validate()
            self.val_loss_untrained = self.val_untrained["loss"]
            start_epoch, skip = 0, 0
        else:
            start_epoch, skip = resume
        bar = tqdm(total=self.total_steps, initial=self.global_step, desc="train draft",
                   unit="step", mininterval=1.0, disable=not (self.progress and self.d.main))
        try:
            return self._loop(bar, start_epoch, skip)
        finally:
            bar.close()

    def _loop(self, bar: Any, start_epoch: int, skip: int) -> dict[str, Any]:
        steps_this_run, tokens_this_run, train_s = 0, 0.0, 0.0
        self.model.train()
        done = self.global_step >= self.total_steps
        for epoch in range(start_epoch, self.t.epochs):
            if done:
                break
            batches = self._batches(self.train_ds, epoch, train=True)
            step_in_epoch = skip if epoch == start_epoch else 0
            todo = batches[step_in_epoch:]
            # a resumed epoch's first batches were trained by the killed run, on this rank
            # (the fingerprint guarantees the same plan)
            seen = [i for b in batches[:step_in_epoch] for i in b]
            for rows, batch in zip(todo, self._loader(self.train_ds, todo), strict=True):
                seen.extend(rows)
                t0 = time.perf_counter()
                out = self.train_step(batch, self.global_step)
                sums = _all_reduce(out["sums"], self.d, self.device)
                dt = time.perf_counter() - t0
                self.global_step += 1
                step_in_epoch += 1
                steps_this_run += 1
                tokens_this_run += sums["tokens_sum"]
                train_s += dt
                row = summarize(sums, self.k)
                self.history.steps.append({
                    "step": self.global_step, "epoch": epoch, "loss": row["loss"],
                    **{f"acc_{i}": a for i, a in enumerate(row["accuracy_per_position"])},
                    "lr": out["lr"], "tokens_per_s": sums["tokens_sum"] / dt if dt else 0.0,
                })
                bar.update(1)
                bar.set_postfix(loss=f"{row['loss']:.3f}", acc0=f"{row['accuracy_per_position'][0]:.2f}", refresh=False)
                done = self.global_step >= self.total_steps
                end_of_epoch = step_in_epoch == len(batches)
                if not (done or end_of_epoch) and self.global_step % max(1, self.t.checkpoint_every_steps) == 0:
                    self.save_state(epoch, step_in_epoch)
                if self.t.fail_after_steps is not None and steps_this_run >= self.t.fail_after_steps:
                    raise SimulatedFailure(
                        f"train.fail_after_steps={self.t.fail_after_steps}: simulated failure at "
                        f"step {self.global_step} (test-only fault)"
                    )
                if done:
                    break
            self._record_sharding(epoch, seen)
            if step_in_epoch == len(batches) or done:
                val = self.validate()
                self.history.epochs.append({
                    "epoch": epoch, "step": self.global_step, "val_loss": val["loss"],
                    **{f"val_acc_{i}": a for i, a in enumerate(val["accuracy_per_position"])},
                })
                log.info("epoch %d: val loss %.4f, per-position accuracy %s", epoch,
                         val["loss"], [round(a, 3) for a in val["accuracy_per_position"]])
                self.save_state(epoch + 1, 0, finished=done or epoch + 1 == self.t.epochs)
                self.last_val = val
        if not hasattr(self, "last_val"):
            self.last_val = self.validate()
        return {
            "steps_this_run": steps_this_run,
            "tokens_this_run": tokens_this_run,
            "train_s": train_s,
            "val": self.last_val,
        }


# --------------------------------------------------------------------------- outputs


def save_draft(model: Any, out_dir: Path, speculative_tokens: int,
               state_dict: dict[str, Any] | None = None) -> dict[str, Any]:
    """``save_pretrained`` into ``out_dir`` atomically; return the written config.

    ``state_dict``: the full weights when the model is FSDP-sharded (gathered on rank 0,
    as speculators' ``DistributedCheckpointer`` does); None = the model's own."""
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(str(tmp), state_dict=state_dict)
        cfg_path = tmp / "config.json"
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
        # Written explicitly: vLLM's defaults differ from speculators' or are absent.
        config["norm_before_residual"] = bool(model.config.norm_before_residual)
        config.setdefault("transformer_layer_config", {})["num_aux_hidden_states"] = len(
            model.config.eagle_aux_hidden_state_layer_ids
        )
        methods = config["speculators_config"]["proposal_methods"]
        if methods[0].get("speculative_tokens") != speculative_tokens:
            raise TrainingError("speculative_tokens was not written to the draft config")
        atomic_write_text(cfg_path, json.dumps(config, indent=2, sort_keys=True) + "\n")
    return config


def write_plots(history: History, plots: Path, k: int) -> None:
    """``steps.tsv`` / ``epochs.tsv`` for ``dvc plots`` and ``curves.png`` for everyone."""
    step_cols = ["step", "epoch", "loss", *[f"acc_{i}" for i in range(k)], "lr", "tokens_per_s"]
    epoch_cols = ["epoch", "step", "val_loss", *[f"val_acc_{i}" for i in range(k)]]
    for name, cols, rows in (("steps.tsv", step_cols, history.steps),
                             ("epochs.tsv", epoch_cols, history.epochs)):
        lines = ["\t".join(cols)] + ["\t".join(f"{r.get(c, '')}" for c in cols) for r in rows]
        atomic_write_text(plots / name, "\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_l, ax_a) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [r["step"] for r in history.steps]
    ax_l.plot(steps, [r["loss"] for r in history.steps], lw=0.8, label="train loss")
    if history.epochs:
        ax_l.plot([r["step"] for r in history.epochs], [r["val_loss"] for r in history.epochs],
                  "o-", label="val loss")
    ax_l.set_xlabel("step")
    ax_l.set_ylabel("loss (sum over TTT steps)")
    ax_l.legend()
    for i in range(k):
        ax_a.plot([r["step"] for r in history.epochs],
                  [r[f"val_acc_{i}"] for r in history.epochs], "o-", label=f"val acc pos {i}")
    ax_a.set_xlabel("step")
    ax_a.set_ylabel("accuracy (all positions <= i correct)")
    ax_a.set_ylim(0, 1)
    ax_a.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(plots / "curves.png", buf.getvalue())


def _local_fraction(model: Any) -> float:
    total = local = 0
    for p in model.parameters():
        total += p.numel()
        local += p.to_local().numel() if hasattr(p, "to_local") else p.numel()
    return local / total if total else 1.0


def train(cfg: Config, progress: bool = True) -> dict[str, Any]:
    """Train (or resume) the draft; on rank 0 write data/draft, plots and the metrics.

    Returns the metrics dict (rank 0) or ``{}`` on other ranks.
    """
    t_start = time.perf_counter()
    plan = plan_training(cfg)
    d = init_distributed(plan.runtime.device)
    try:
        trainer = DraftTrainer(cfg, plan, d, progress=progress)
        result = trainer.run()
        # under FSDP a gather (every rank), rank 0 saves; else the model's own state dict
        full = trainer.full_state_dict() if trainer.parallel == "fsdp" else None
        if not d.main:
            return {}
        config = save_draft(trainer.model, plan.paths.draft, cfg.train.speculative_tokens,
                            state_dict=full)
        write_plots(trainer.history, plan.paths.plots, trainer.k)
        val = result["val"]
        untrained = trainer.val_loss_untrained
        wall = time.perf_counter() - t_start
        metrics = {
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
            "steps_per_s": result["steps_this_run"] / result["train_s"] if result["train_s"] else 0,
            "tokens_per_s": result["tokens_this_run"] / result["train_s"] if result["train_s"] else 0,
            "wall_s": wall,
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
            "required_tokens": plan.required_tokens,
            "aux_layer_ids": config.get("eagle_aux_hidden_state_layer_ids"),
            "trainable_parameters": sum(
                p.numel() for p in trainer.model.parameters() if p.requires_grad),
            # share of the parameters rank 0 holds: 1 unsharded, ~1/world under FSDP
            "local_parameter_fraction": _local_fraction(trainer.model),
            "train_rows": len(trainer.train_ds),
            "val_rows": len(trainer.val_ds),
        }
        return metrics
    finally:
        if d.world > 1:
            import torch.distributed as dist

            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    """Worker entrypoint for ``torchrun -m eagle3_pipeline.train.trainer --params FILE --out F``.

    Rank 0 writes the metrics it computed to ``--out``; the stage adds the NVML reading
    taken after all workers exited and writes metrics/train.json.
    """
    import argparse

    from eagle3_pipeline.core.config import load_config
    from eagle3_pipeline.stages.runner import setup_logging

    parser = argparse.ArgumentParser(prog="eagle3_pipeline.train.trainer")
    parser.add_argument("--params", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    setup_logging()
    cfg = load_config(params=args.params)
    try:
        metrics = train(cfg)
    except (ConfigError, TrainingError, SimulatedFailure, FileNotFoundError) as exc:
        print(f"error: train: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    if metrics:
        atomic_write_json(args.out, metrics)


if __name__ == "__main__":
    main()
