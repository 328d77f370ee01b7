"""Storage, draft, disk and time estimates shared by ``preflight`` (disk check) and
``plan`` (the full picture); the target they start from is :mod:`.target_info`, the
target's serving weights :mod:`.weights`.

Why one module: preflight refuses a run whose hidden states will not fit on disk, and the
plan tells a user the same number before they start; two formulas would disagree. Every
figure here comes from the composed config and the target's ``config.json`` (through the
target adapter) -- never from weights, never importing torch -- so a 1T-parameter target
is estimated in milliseconds from a config-only replica.

Each figure says what it is based on: an estimate from shapes, an assumption from the
hardware profile, or a measurement from an earlier run's metrics file.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from eagle3_pipeline.core.choices import Dtype
from eagle3_pipeline.core.config import DataConfig, DraftShapeConfig, ThroughputAssumptions
from eagle3_pipeline.core.metrics import HasDetails, details_path, read_details
from eagle3_pipeline.core.records import Record, RecordError
from eagle3_pipeline.data.record import PrepareRecord
from eagle3_pipeline.data.source_size import selectable_samples
from eagle3_pipeline.extract.record import ExtractRecord
from eagle3_pipeline.plan.target_info import TargetInfo
from eagle3_pipeline.plan.units import (
    ADAM_STATE_BYTES,
    DTYPE_BYTES,
    GB,
    TOKEN_ID_BYTES,
    fmt_gb,
)
from eagle3_pipeline.train.record import TrainRecord

FreeBytesFn = Callable[[Path], int]
R = TypeVar("R", bound=Record)


# --------------------------------------------------------------------------- what they read
# Each estimate types its config argument with what it reads: preflight passes its input
# view (which declares exactly that), ``eagle3-plan`` the whole config.


class _ExtractDtype(Protocol):
    @property
    def dtype(self) -> Dtype: ...


class _Samples(Protocol):
    @property
    def samples(self) -> int: ...


class StorageInputs(HasDetails, Protocol):
    @property
    def seed(self) -> int: ...
    @property
    def data(self) -> DataConfig: ...
    @property
    def extract(self) -> _ExtractDtype: ...
    @property
    def train(self) -> _Samples: ...


class _DraftTrain(Protocol):
    @property
    def draft(self) -> DraftShapeConfig: ...
    @property
    def draft_vocab_size(self) -> int: ...
    @property
    def dtype(self) -> Dtype | None: ...
    @property
    def tokens_per_step(self) -> int: ...
    @property
    def speculative_tokens(self) -> int: ...


class _TrainDtype(Protocol):
    @property
    def train_dtype(self) -> Dtype: ...


class DraftInputs(Protocol):
    @property
    def train(self) -> _DraftTrain: ...
    @property
    def hardware(self) -> _TrainDtype: ...
    @property
    def extract(self) -> _ExtractDtype: ...


class _Disk(Protocol):
    @property
    def disk_path(self) -> str | None: ...
    @property
    def min_free_disk_gb(self) -> float: ...


class DiskInputs(Protocol):
    @property
    def preflight(self) -> _Disk: ...
    @property
    def data_dir(self) -> str: ...


class _Epochs(Protocol):
    @property
    def epochs(self) -> int: ...


class _TimeHardware(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def throughput(self) -> ThroughputAssumptions: ...


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class TimeInputs(HasDetails, Protocol):
    @property
    def train(self) -> _Epochs: ...
    @property
    def hardware(self) -> _TimeHardware: ...
    @property
    def model(self) -> _Named: ...


# --------------------------------------------------------------------------- metrics files


def _earlier_run(cfg: HasDetails, record: type[R]) -> tuple[R | None, str]:
    """An earlier run's record of a stage, or None and why not: none yet, or one this
    pipeline cannot read (its one-line error: the estimate falls back to an assumption and
    says so, instead of refusing -- preflight runs this before the stage that rebuilds it)."""
    try:
        found = read_details(cfg, record)
    except RecordError as exc:
        return None, f"{exc}, ignored"
    return found, "" if found is not None else f"no {details_path(cfg, record.STAGE)} yet"


# --------------------------------------------------------------------------- hidden states


@dataclass
class StorageEstimate:
    """Disk for the hidden states of ``samples`` training conversations."""

    captured_layer_ids: list[int]
    hidden_size: int
    dtype: str
    bytes_per_token: int  # (n_aux + 1) * hidden * dtype bytes
    samples: int
    mean_tokens_per_row: float | None
    rows_per_conversation: float
    tokens_per_conversation: float
    total_tokens: float
    total_bytes: int  # states + token ids (int64) for every token
    upper_bound: bool
    basis: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def hidden_state_bytes_per_token(n_captured: int, hidden: int, dtype: str) -> int:
    """Bytes one token's captured states take (``extract.dtype`` is a schema Enum)."""
    return n_captured * hidden * DTYPE_BYTES[dtype]


def estimate_storage(cfg: StorageInputs, target: TargetInfo) -> StorageEstimate:
    """Hidden-state storage: measured tokens per row from ``metrics/prepare.json`` when an
    earlier prepare run left it, else ``data.max_seq_len`` per conversation, labelled an
    upper bound (it bounds each row; conversations yielding several rows can exceed it)."""
    captured = target.captured_layer_ids
    hidden = target.spec.hidden_size
    dtype = cfg.extract.dtype
    bpt = hidden_state_bytes_per_token(len(captured), hidden, dtype)
    samples, samples_basis = selectable_samples(cfg.data, cfg.train.samples, cfg.seed)
    prep, why_not = _earlier_run(cfg, PrepareRecord)
    if prep is not None and prep.mean_tokens_per_row > 0:
        mean = float(prep.mean_tokens_per_row)
        convs = prep.conversations_train
        ratio = prep.rows / convs if convs > 0 else 1.0
        per_conv = mean * ratio
        upper, basis = (
            False,
            f"measured: {mean:,.1f} tokens/row x {ratio:.2f} rows/conversation "
            f"({details_path(cfg, 'prepare')})",
        )
        mean_f: float | None = mean
    else:
        ratio, per_conv, mean_f = 1.0, float(cfg.data.max_seq_len), None
        upper, basis = (
            True,
            f"upper bound: data.max_seq_len={cfg.data.max_seq_len} tokens per conversation "
            f"({why_not or 'no rows measured'})",
        )
    tokens = per_conv * samples
    return StorageEstimate(
        captured_layer_ids=captured,
        hidden_size=hidden,
        dtype=dtype,
        bytes_per_token=bpt,
        samples=samples,
        mean_tokens_per_row=mean_f,
        rows_per_conversation=ratio,
        tokens_per_conversation=per_conv,
        total_tokens=tokens,
        total_bytes=int(math.ceil(tokens * (bpt + TOKEN_ID_BYTES))),
        upper_bound=upper,
        basis=f"{basis}; {samples_basis}",
    )


# --------------------------------------------------------------------------- the draft


@dataclass
class DraftEstimate:
    """The EAGLE-3 draft (a llama-type decoder layer vLLM can load) and its training cost."""

    layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    n_aux: int
    vocab_size: int
    draft_vocab_size: int
    shape_source: str
    # an MLA draft layer's latent attention (the target's), e.g. "kv_lora 512, q_lora 1536,
    # rope 64, nope 128, v 128"; None for standard attention
    latent: str | None
    params_total: int
    params_trainable: int
    train_dtype: str
    tokens_per_step: int
    ttt_steps: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    train_memory_bytes: int  # per training process (DDP replicates the draft)
    checkpoint_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate_draft(cfg: DraftInputs, target: TargetInfo) -> DraftEstimate:
    """Parameters, optimizer state, activations per step and checkpoint size of the draft.

    The shape is the one the train stage builds (:func:`draft.resolve_draft_shape`:
    ``train.draft.*`` over rules derived from the target). Activations are an estimate
    (what autograd keeps for backward, per token and TTT step, with a memory-efficient
    attention kernel; logits in fp32): good to a factor, enough to see whether the draft
    fits on a GPU.
    """
    from eagle3_pipeline.draft.shape import (  # no torch / speculators at import time
        estimate_parameters,
        resolve_draft_shape,
    )

    spec = target.spec
    shape = resolve_draft_shape(cfg.train.draft, spec)
    h, n_aux = spec.hidden_size, len(spec.aux_layer_ids)
    heads, kv, hd, inter = (
        shape.num_attention_heads,
        shape.num_key_value_heads,
        shape.head_dim,
        shape.intermediate_size,
    )
    dv = min(cfg.train.draft_vocab_size, spec.vocab_size)
    # fc, the decoder layers (MLA or standard attention) and the norms, as the train stage
    # builds them; the draft lm_head counted as trained (speculators 0.9 freezes it: this
    # errs on the safe side)
    layers_and_fc, _ = estimate_parameters(shape, n_aux, dv, spec.vocab_size, cfg.train.draft)
    trainable = layers_and_fc + dv * h
    frozen = spec.vocab_size * h  # embeddings, loaded from the target
    total = trainable + frozen
    dtype = cfg.train.dtype or cfg.hardware.train_dtype
    pb = DTYPE_BYTES[dtype]
    tokens = cfg.train.tokens_per_step
    k = cfg.train.speculative_tokens
    per_layer_act = 6 * h + 2 * heads * hd + 2 * kv * hd + 3 * inter
    per_token_step = pb * (2 * h + shape.num_layers * per_layer_act) + 4 * 3 * dv
    inputs = tokens * (n_aux + 1) * h * DTYPE_BYTES[cfg.extract.dtype]
    activations = tokens * k * per_token_step + inputs + tokens * n_aux * h * pb
    weights, grads, opt = total * pb, trainable * pb, trainable * ADAM_STATE_BYTES
    ckpt = total * pb + trainable * ADAM_STATE_BYTES + dv * 8 + spec.vocab_size
    return DraftEstimate(
        layers=shape.num_layers,
        hidden_size=h,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=hd,
        intermediate_size=inter,
        n_aux=n_aux,
        vocab_size=spec.vocab_size,
        draft_vocab_size=dv,
        shape_source=f"{shape.layer_type}; train.draft over rules derived from the target",
        latent=(
            f"kv_lora {shape.mla.kv_lora_rank}, q_lora {shape.mla.q_lora_rank}, "
            f"rope {shape.mla.qk_rope_head_dim}, nope {shape.mla.qk_nope_head_dim}, "
            f"v {shape.mla.v_head_dim}"
            if shape.mla is not None
            else None
        ),
        params_total=total,
        params_trainable=trainable,
        train_dtype=dtype,
        tokens_per_step=tokens,
        ttt_steps=k,
        weights_bytes=weights,
        grads_bytes=grads,
        optimizer_bytes=opt,
        activation_bytes=activations,
        train_memory_bytes=weights + grads + opt + activations,
        checkpoint_bytes=ckpt,
    )


# --------------------------------------------------------------------------- disk


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem that will hold ``path`` (it may not exist yet)."""
    p = Path(path).resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


@dataclass
class DiskNeed:
    path: str
    hidden_states_bytes: int
    checkpoint_bytes: int
    margin_bytes: int
    need_bytes: int
    free_bytes: int
    upper_bound: bool

    @property
    def fits(self) -> bool:
        return self.free_bytes >= self.need_bytes

    def problem(self) -> str | None:
        if self.fits:
            return None
        return (
            f"need {fmt_gb(self.need_bytes)} free under {self.path}/, have "
            f"{fmt_gb(self.free_bytes)} (hidden states {fmt_gb(self.hidden_states_bytes)}"
            f"{' upper bound' if self.upper_bound else ''}, checkpoint "
            f"{fmt_gb(self.checkpoint_bytes)}, margin {fmt_gb(self.margin_bytes)}): "
            "free space, point data_dir elsewhere or lower train.samples"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits}


def disk_need(
    cfg: DiskInputs,
    storage: StorageEstimate,
    draft: DraftEstimate,
    free_fn: FreeBytesFn = free_bytes,
    path: str | None = None,
) -> DiskNeed:
    """Hidden states + one checkpoint + ``preflight.min_free_disk_gb`` vs free space."""
    where = path or cfg.preflight.disk_path or cfg.data_dir
    margin = int(cfg.preflight.min_free_disk_gb * GB)
    need = storage.total_bytes + draft.checkpoint_bytes + margin
    return DiskNeed(
        path=str(where).rstrip("/"),
        hidden_states_bytes=storage.total_bytes,
        checkpoint_bytes=draft.checkpoint_bytes,
        margin_bytes=margin,
        need_bytes=need,
        free_bytes=int(free_fn(Path(where))),
        upper_bound=storage.upper_bound,
    )


# --------------------------------------------------------------------------- time


@dataclass
class TimeEstimate:
    what: str
    work: float  # tokens (extract) or steps (train)
    rate: float  # per second
    seconds: float
    source: str  # "assumption: ..." or "measured: ..."

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _measured(
    cfg: TimeInputs, record: type[ExtractRecord | TrainRecord]
) -> tuple[float, str] | None:
    """The ``tokens_per_s`` of an earlier run's record, only when measured on this hardware
    profile and for this model."""
    found, _ = _earlier_run(cfg, record)
    if found is None:
        return None
    if (
        found.hardware != cfg.hardware.name
        or found.target != cfg.model.name
        or found.tokens_per_s <= 0
    ):
        return None
    return float(found.tokens_per_s), f"measured: tokens_per_s in {details_path(cfg, found.STAGE)}"


def estimate_time(cfg: TimeInputs, storage: StorageEstimate) -> tuple[TimeEstimate, TimeEstimate]:
    """Extraction: tokens / tokens per s. Training: epochs x samples conversations at a rate
    in conversations per s (``hardware.throughput.train_conversations_per_s``, the unit
    hand-run workflows report as "steps" of one conversation). A measured rate comes from the train stage's ``tokens_per_s`` (it packs
    many conversations per optimizer step, so its own steps/s is not comparable), divided
    by the tokens per conversation of this estimate."""
    tp = cfg.hardware.throughput
    ext = _measured(cfg, ExtractRecord) or (
        tp.extract_tokens_per_s,
        f"assumption: hardware.throughput.extract_tokens_per_s ({tp.source})",
    )
    measured = _measured(cfg, TrainRecord)
    per_conv = storage.tokens_per_conversation
    if measured and per_conv > 0:
        trn = (measured[0] / per_conv, f"{measured[1]} / {per_conv:,.0f} tokens per conversation")
    else:
        trn = (
            tp.train_conversations_per_s,
            f"assumption: hardware.throughput.train_conversations_per_s ({tp.source})",
        )
    steps = float(cfg.train.epochs * storage.samples)
    return (
        TimeEstimate(
            "extract", storage.total_tokens, ext[0], storage.total_tokens / ext[0], ext[1]
        ),
        TimeEstimate("train", steps, trn[0], steps / trn[0], trn[1]),
    )


def host_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0
