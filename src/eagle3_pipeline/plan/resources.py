"""Resource estimates shared by ``preflight`` (disk check) and ``plan`` (the full picture).

Why one module: preflight refuses a run whose hidden states will not fit on disk, and the
plan tells a user the same number before they start; two formulas would disagree. Every
figure here comes from the composed config and the target's ``config.json`` (through the
target adapter) -- never from weights, never importing torch -- so a 1T-parameter target
is estimated in milliseconds from a config-only replica.

Each figure says what it is based on: an estimate from shapes, an assumption from the
hardware profile, or a measurement from an earlier run's metrics file.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config import (
    Config,
    ConfigError,
    ModelConfig,
    TinyModelConfig,
    metrics_path,
)
from eagle3_pipeline.targets.adapter import (
    TargetSpec,
    describe_config,
    read_json,
    read_weight_names,
    split_text_config,
)

GB = 1000**3
GIB = 1024**3
MIB = 1024**2

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# Every hidden-state file stores the row's token ids (int64) next to the states.
TOKEN_ID_BYTES = 8
ADAM_STATE_BYTES = 8  # two fp32 moments per trainable parameter

FreeBytesFn = Callable[[Path], int]


def fmt_gb(n: float) -> str:
    """Disk sizes in decimal GB (what ``df -H`` and cloud quotas show)."""
    if n < GB:
        return f"{n / 1000**2:,.1f} MB"
    return f"{n / GB:,.1f} GB" if n < 100 * GB else f"{n / GB:,.0f} GB"


def fmt_gib(n: float) -> str:
    return f"{n / GIB:,.1f} GiB"


def fmt_duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


# --------------------------------------------------------------------------- the target


@dataclass
class TargetInfo:
    """The target's adapter description plus its raw config (for weight counting)."""

    spec: TargetSpec
    config: dict[str, Any]
    source: str  # where the config came from

    @property
    def text(self) -> dict[str, Any]:
        return split_text_config(self.config)[1]

    @property
    def captured_layer_ids(self) -> list[int]:
        """What extraction captures: the aux layers, then the final state (id = L, the
        stream leaving the last layer, before the final norm)."""
        return [*self.spec.aux_layer_ids, self.spec.num_layers]


def tiny_config(tiny: TinyModelConfig) -> dict[str, Any]:
    """The ``config.json`` the target stage will write for the tiny target, derived from
    its shape without building anything (mirrors ``tiny.build_model``)."""
    common = {
        "hidden_size": tiny.hidden_size,
        "num_hidden_layers": tiny.num_layers,
        "num_attention_heads": tiny.num_heads,
        "intermediate_size": tiny.intermediate_size,
        "vocab_size": tiny.vocab_size,
        "max_position_embeddings": tiny.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    }
    if tiny.architecture == "llama":
        return {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "num_key_value_heads": max(1, tiny.num_heads // 2),
            **common,
        }
    text = {
        "model_type": "deepseek_v3",
        "num_key_value_heads": tiny.num_heads,
        "q_lora_rank": tiny.q_lora_rank,
        "kv_lora_rank": tiny.kv_lora_rank,
        "qk_rope_head_dim": tiny.qk_rope_head_dim,
        "qk_nope_head_dim": tiny.qk_nope_head_dim,
        "v_head_dim": tiny.v_head_dim,
        "n_routed_experts": tiny.n_routed_experts,
        "num_experts_per_tok": tiny.num_experts_per_tok,
        "n_shared_experts": tiny.n_shared_experts,
        "moe_intermediate_size": tiny.moe_intermediate_size,
        "first_k_dense_replace": tiny.first_k_dense_replace,
        **common,
    }
    return {
        "model_type": "kimi_k25",
        "architectures": ["Kimi_K25ForConditionalGeneration"],
        "text_config": text,
        "vision_config": {"hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64},
        "tie_word_embeddings": False,
    }


def hf_cache_dir(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    home = Path(env["HF_HOME"]) if env.get("HF_HOME") else Path.home() / ".cache" / "huggingface"
    return home / "hub"


def find_in_hf_cache(hub_id: str, revision: str | None, cache: Path) -> Path | None:
    """The snapshot directory of ``hub_id`` (at ``revision``, else what ``refs/main``
    points to) in a local Hugging Face cache, if it holds a config.json."""
    repo = cache / ("models--" + hub_id.replace("/", "--"))
    rev = revision
    if rev is None:
        ref = repo / "refs" / "main"
        rev = ref.read_text(encoding="utf-8").strip() if ref.is_file() else None
    if rev is None:
        return None
    snap = repo / "snapshots" / rev
    return snap if (snap / "config.json").is_file() else None


def load_target(model: ModelConfig, hf_cache: Path | None = None) -> TargetInfo:
    """Describe the configured target without building or downloading anything.

    Order: the tiny target's shape; ``model.path``; the local HF cache of ``model.hub_id``.
    Otherwise fail with the one thing to do (pass ``model.path=DIR``).
    """
    if model.tiny is not None:
        config = tiny_config(model.tiny)
        return TargetInfo(describe_config(config, model), config, "tiny target shape (model.tiny)")
    if model.path:
        model_dir = Path(model.path)
        source = f"model.path={model.path}"
    else:
        found = (
            find_in_hf_cache(model.hub_id, model.revision, hf_cache or hf_cache_dir())
            if model.hub_id
            else None
        )
        if found is None:
            raise ConfigError(
                f"model {model.name}: no config.json to read: model.path is null and "
                f"{model.hub_id} is not in the local Hugging Face cache; pass model.path=DIR "
                f"(a directory holding at least config.json)"
            )
        model_dir = found
        source = f"HF cache {found}"
    config = read_json(model_dir / "config.json", "config.json (pass model.path=DIR)")
    spec = describe_config(config, model, read_weight_names(model_dir))
    return TargetInfo(spec, config, source)


# --------------------------------------------------------------------------- metrics files


def read_metrics(cfg: Config, stage: str) -> dict[str, Any] | None:
    """An earlier run's ``metrics/<stage>.json``, or None (absent or unreadable)."""
    p = metrics_path(cfg, stage)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _hardware_name(metrics: dict[str, Any]) -> str | None:
    hw = metrics.get("hardware")
    if isinstance(hw, dict):
        hw = hw.get("name")
    return str(hw) if hw is not None else None


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
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"extract.dtype={dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
    return n_captured * hidden * DTYPE_BYTES[dtype]


def estimate_storage(cfg: Config, target: TargetInfo) -> StorageEstimate:
    """Hidden-state storage: measured tokens per row from ``metrics/prepare.json`` when an
    earlier prepare run left it, else ``data.max_seq_len`` per conversation, labelled an
    upper bound (it bounds each row; conversations yielding several rows can exceed it)."""
    captured = target.captured_layer_ids
    hidden = target.spec.hidden_size
    dtype = cfg.extract.dtype
    bpt = hidden_state_bytes_per_token(len(captured), hidden, dtype)
    samples = cfg.train.samples
    prep = read_metrics(cfg, "prepare") or {}
    mean = prep.get("mean_tokens_per_row")
    if isinstance(mean, (int, float)) and mean > 0:
        rows, convs = prep.get("rows"), prep.get("conversations_train")
        ratio = (
            float(rows) / float(convs)
            if isinstance(rows, (int, float)) and isinstance(convs, (int, float)) and convs > 0
            else 1.0
        )
        per_conv = float(mean) * ratio
        upper, basis = (
            False,
            f"measured: {mean:,.1f} tokens/row x {ratio:.2f} rows/conversation "
            f"({Path(cfg.metrics_dir) / 'prepare.json'})",
        )
        mean_f: float | None = float(mean)
    else:
        ratio, per_conv, mean_f = 1.0, float(cfg.data.max_seq_len), None
        upper, basis = (
            True,
            f"upper bound: data.max_seq_len={cfg.data.max_seq_len} tokens per conversation "
            "(no metrics/prepare.json yet)",
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
        basis=basis,
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


def estimate_draft(cfg: Config, target: TargetInfo) -> DraftEstimate:
    """Parameters, optimizer state, activations per step and checkpoint size of the draft.

    The shape is the one the train stage builds (:func:`draft.resolve_draft_shape`:
    ``train.draft.*`` over rules derived from the target). Activations are an estimate
    (what autograd keeps for backward, per token and TTT step, with a memory-efficient
    attention kernel; logits in fp32): good to a factor, enough to see whether the draft
    fits on a GPU.
    """
    from eagle3_pipeline.draft.shape import (
        resolve_draft_shape,  # no torch / speculators at import time
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
    layer_params = 0
    for i in range(shape.num_layers):
        width_in = 2 * h if i == 0 else h  # layer 0 sees [embedding; fused hidden state]
        layer_params += width_in * (heads + 2 * kv) * hd + heads * hd * h + 3 * h * inter + 3 * h
    fc = n_aux * h * h
    trainable = fc + layer_params + h + dv * h  # + final norm + draft lm_head
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
    cfg: Config,
    storage: StorageEstimate,
    draft: DraftEstimate,
    free_fn: FreeBytesFn = free_bytes,
    path: str | None = None,
) -> DiskNeed:
    """Hidden states + one checkpoint + ``preflight.min_free_disk_gb`` vs free space."""
    where = path or getattr(cfg.preflight, "disk_path", None) or cfg.data_dir
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


# --------------------------------------------------------------------------- serving weights


def _quant_config(config: dict[str, Any]) -> dict[str, Any] | None:
    q = config.get("quantization_config") or split_text_config(config)[1].get("quantization_config")
    return q if isinstance(q, dict) else None


def _ignored(name: str, ignore: list[str]) -> bool:
    for entry in ignore:
        if entry.startswith("re:"):
            if re.match(entry[3:], name):
                return True
        elif name == entry or name.endswith("." + entry):
            return True
    return False


def linear_weight_bytes(config: dict[str, Any], module: str, dtype_bytes: int) -> float:
    """Bytes per parameter of one Linear module under the checkpoint's quantization.

    compressed-tensors (Kimi's INT4 experts): ``num_bits`` / 8 plus one bf16 scale per
    ``group_size`` weights, unless the module is in ``ignore``; fp8 (DeepSeek-V3): 1 byte.
    """
    q = _quant_config(config)
    if not q:
        return float(dtype_bytes)
    method = q.get("quant_method")
    if method == "compressed-tensors":
        if _ignored(module, list(q.get("ignore") or [])):
            return float(dtype_bytes)
        for group in (q.get("config_groups") or {}).values():
            w = group.get("weights") or {}
            if "Linear" in (group.get("targets") or []) and w.get("num_bits"):
                gs = w.get("group_size")
                return w["num_bits"] / 8 + (2 / gs if gs else 0.0)
        return float(dtype_bytes)
    if method == "fp8":
        skip = list(q.get("modules_to_not_convert") or q.get("ignored_layers") or [])
        return float(dtype_bytes) if _ignored(module, skip) else 1.0
    return float(dtype_bytes)


@dataclass
class WeightEstimate:
    params: int
    expert_params: int
    bytes_total: float
    expert_bytes: float
    dense_bytes: float
    quantization: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _vision_params(vc: dict[str, Any] | None, text_hidden: int) -> int:
    if not isinstance(vc, dict):
        return 0
    h = vc.get("vt_hidden_size") or vc.get("hidden_size") or 0
    n = vc.get("vt_num_hidden_layers") or vc.get("num_hidden_layers") or vc.get("depth") or 0
    inter = vc.get("vt_intermediate_size") or vc.get("intermediate_size") or 4 * h
    if not (h and n):
        return 0
    merged = 4 * h  # 2x2 patch merge before the projector
    return n * (4 * h * h + 2 * h * inter) + merged * merged + merged * text_hidden


def estimate_target_weights(target: TargetInfo) -> WeightEstimate:
    """Weight memory of the target as vLLM loads it (from the config, not the files)."""
    config, t, spec = target.config, target.text, target.spec
    h, n_layers, v = spec.hidden_size, spec.num_layers, spec.vocab_size
    prefix = spec.weight_prefix or "model."
    dtype_bytes = DTYPE_BYTES.get(str(spec.torch_dtype), 2)

    def lin(module: str) -> float:
        return linear_weight_bytes(config, prefix + module, dtype_bytes)

    heads = spec.num_attention_heads
    if spec.attention == "mla":
        rope, nope = int(t.get("qk_rope_head_dim", 0)), int(t.get("qk_nope_head_dim", 0))
        vd, kvr, qr = int(t.get("v_head_dim", nope)), int(t["kv_lora_rank"]), t.get("q_lora_rank")
        q = h * qr + qr * heads * (nope + rope) + qr if qr else h * heads * (nope + rope)
        attn = q + h * (kvr + rope) + kvr + kvr * heads * (nope + vd) + heads * vd * h
    else:
        kvh, hd = spec.num_key_value_heads, spec.head_dim
        attn = h * heads * hd + 2 * h * kvh * hd + heads * hd * h
    experts = spec.num_experts
    moe_inter = int(t.get("moe_intermediate_size") or spec.intermediate_size)
    first_dense = int(t.get("first_k_dense_replace", 0)) if experts else n_layers
    freq = int(t.get("moe_layer_freq", 1) or 1)
    moe_layers = [i for i in range(n_layers) if experts and i >= first_dense and i % freq == 0]
    n_moe, n_dense = len(moe_layers), n_layers - len(moe_layers)
    shared = int(t.get("n_shared_experts") or 0) * 3 * h * moe_inter
    shared += 3 * h * int(t.get("shared_expert_intermediate_size") or 0)
    dense_mlp = 3 * h * spec.intermediate_size
    expert_params = n_moe * experts * 3 * h * moe_inter
    router = n_moe * experts * (h + 1)
    norms = n_layers * 2 * h + h
    embed = v * h
    head = 0 if spec.tie_word_embeddings else v * h
    vision = _vision_params(config.get("vision_config"), h)
    params = n_layers * attn + n_dense * dense_mlp + n_moe * shared + expert_params
    params += router + norms + embed + head + vision
    moe_l, dense_l = (moe_layers[0] if moe_layers else 0), 0
    expert_bytes = expert_params * lin(f"layers.{moe_l}.mlp.experts.0.gate_proj")
    dense_bytes = (
        n_layers * attn * lin(f"layers.{dense_l}.self_attn.o_proj")
        + n_dense * dense_mlp * lin(f"layers.{dense_l}.mlp.gate_proj")
        + n_moe * shared * lin(f"layers.{moe_l}.mlp.shared_experts.gate_proj")
        + head * linear_weight_bytes(config, "lm_head", dtype_bytes)
        + (router + norms + embed + vision) * dtype_bytes
    )
    q = _quant_config(config)
    label = "none" if not q else str(q.get("quant_method"))
    if experts and expert_bytes < expert_params * dtype_bytes:
        label += f" ({expert_bytes / expert_params * 8:.2f} bits per expert weight)"
    return WeightEstimate(
        params=int(params),
        expert_params=int(expert_params),
        bytes_total=expert_bytes + dense_bytes,
        expert_bytes=expert_bytes,
        dense_bytes=dense_bytes,
        quantization=label,
    )


@dataclass
class ServingEstimate:
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    expert_parallel: bool
    gpus_used: int
    gpus_available: int
    weights_per_gpu_bytes: float
    usable_per_gpu_bytes: float
    headroom_per_gpu_bytes: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate_serving(cfg: Config, weights: WeightEstimate) -> ServingEstimate:
    """Weights per GPU for vLLM with the profile's parallel sizes: dense weights are split
    over TP x PP (replicated per DP rank); experts over TP x PP x DP with expert
    parallelism. Headroom is what is left for the KV cache and activations."""
    s, hw = cfg.hardware.serving, cfg.hardware
    tp, pp, dp = s.tensor_parallel_size, s.pipeline_parallel_size, s.data_parallel_size
    expert_split = tp * pp * (dp if s.enable_expert_parallel else 1)
    per_gpu = weights.dense_bytes / (tp * pp) + weights.expert_bytes / expert_split
    usable = (hw.gpu_memory_mib or 0) * MIB * s.gpu_memory_utilization
    return ServingEstimate(
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        data_parallel_size=dp,
        expert_parallel=s.enable_expert_parallel,
        gpus_used=tp * pp * dp,
        gpus_available=hw.gpu_count * hw.nodes,
        weights_per_gpu_bytes=per_gpu,
        usable_per_gpu_bytes=usable,
        headroom_per_gpu_bytes=usable - per_gpu,
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


def _measured(cfg: Config, stage: str, key: str) -> tuple[float, str] | None:
    """A rate from an earlier run's metrics, only when measured on this hardware profile
    (and this model, when the file says which)."""
    m = read_metrics(cfg, stage)
    if not m or _hardware_name(m) != cfg.hardware.name:
        return None
    model = m.get("model", m.get("target"))
    if isinstance(model, dict):
        model = model.get("name")
    if model is not None and model != cfg.model.name:
        return None
    value = m.get(key)
    if not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value), f"measured: {key} in {Path(cfg.metrics_dir) / (stage + '.json')}"


def estimate_time(cfg: Config, storage: StorageEstimate) -> tuple[TimeEstimate, TimeEstimate]:
    """Extraction: tokens / tokens per s. Training: epochs x samples conversations at a rate
    in conversations per s -- the unit the seed workflow reported ("steps" of one
    conversation). A measured rate comes from the train stage's ``tokens_per_s`` (it packs
    many conversations per optimizer step, so its own steps/s is not comparable), divided
    by the tokens per conversation of this estimate."""
    tp = cfg.hardware.throughput
    ext = _measured(cfg, "extract", "tokens_per_s") or (
        tp.extract_tokens_per_s,
        f"assumption: hardware.throughput.extract_tokens_per_s ({tp.source})",
    )
    measured = _measured(cfg, "train", "tokens_per_s")
    per_conv = storage.tokens_per_conversation
    if measured and per_conv > 0:
        trn = (measured[0] / per_conv, f"{measured[1]} / {per_conv:,.0f} tokens per conversation")
    else:
        trn = (
            tp.train_steps_per_s,
            f"assumption: hardware.throughput.train_steps_per_s ({tp.source})",
        )
    steps = float(cfg.train.epochs * cfg.train.samples)
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
