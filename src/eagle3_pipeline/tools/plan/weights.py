"""The target's weight memory as vLLM loads it, and what that leaves per GPU.

Counted from the config, never the files: a config-only replica of a 1T target is enough.
What differs between families (which layers are MoE, how experts are counted and sized,
a router bias, q/k norms) comes from the target's family
(:mod:`eagle3_pipeline.targets.families`); quantization from ``quantization_config``,
because Kimi's INT4 experts and its bf16 attention weigh differently per parameter.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from eagle3_pipeline.core.config import Config
from eagle3_pipeline.plan.target_info import TargetInfo
from eagle3_pipeline.plan.units import DTYPE_BYTES, MIB
from eagle3_pipeline.targets.adapter import split_text_config

# --------------------------------------------------------------------------- quantization


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


def _compressed_tensors_bytes(q: dict[str, Any], module: str, dtype_bytes: int) -> float:
    if _ignored(module, list(q.get("ignore") or [])):
        return float(dtype_bytes)
    for group in (q.get("config_groups") or {}).values():
        w = group.get("weights") or {}
        if "Linear" in (group.get("targets") or []) and w.get("num_bits"):
            gs = w.get("group_size")
            return w["num_bits"] / 8 + (2 / gs if gs else 0.0)
    return float(dtype_bytes)


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
        return _compressed_tensors_bytes(q, module, dtype_bytes)
    if method == "fp8":
        skip = list(q.get("modules_to_not_convert") or q.get("ignored_layers") or [])
        return float(dtype_bytes) if _ignored(module, skip) else 1.0
    return float(dtype_bytes)


# --------------------------------------------------------------------------- parameters


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


def _attention_params(target: TargetInfo) -> int:
    """One decoder layer's attention: MLA's low-rank q / kv projections, or q/k/v/o (+ the
    per-head q/k norms of families that have them)."""
    spec, t = target.spec, target.text
    h, heads = spec.hidden_size, spec.num_attention_heads
    if spec.attention == "mla":
        rope, nope = int(t.get("qk_rope_head_dim", 0)), int(t.get("qk_nope_head_dim", 0))
        vd, kvr, qr = int(t.get("v_head_dim", nope)), int(t["kv_lora_rank"]), t.get("q_lora_rank")
        q = h * qr + qr * heads * (nope + rope) + qr if qr else h * heads * (nope + rope)
        return q + h * (kvr + rope) + kvr + kvr * heads * (nope + vd) + heads * vd * h
    kvh, hd = spec.num_key_value_heads, spec.head_dim
    qk_norm = 2 * hd if target.family.qk_norm else 0
    return h * heads * hd + 2 * h * kvh * hd + heads * hd * h + qk_norm


@dataclass(frozen=True)
class ParamCounts:
    """Parameters by kind: each kind is stored at its own bytes per parameter."""

    attention: int  # per layer
    dense_mlp: int  # per dense layer
    shared_experts: int  # per MoE layer
    experts: int  # all routed experts of all MoE layers
    moe_layers: tuple[int, ...]
    num_layers: int
    unquantized: int  # router, norms, embeddings, vision tower
    lm_head: int

    @property
    def num_dense(self) -> int:
        return self.num_layers - len(self.moe_layers)

    @property
    def total(self) -> int:
        return (
            self.num_layers * self.attention
            + self.num_dense * self.dense_mlp
            + len(self.moe_layers) * self.shared_experts
            + self.experts
            + self.unquantized
            + self.lm_head
        )


def count_params(target: TargetInfo) -> ParamCounts:
    """The target's parameters from its config, laid out the way its family lays them out."""
    t, spec, family = target.text, target.spec, target.family
    h, n_layers, v = spec.hidden_size, spec.num_layers, spec.vocab_size
    moe_layers = tuple(family.moe_layers(t, n_layers))
    experts = spec.num_experts if moe_layers else 0
    moe = family.moe
    moe_inter = moe.expert_size(t, spec.intermediate_size) if moe else spec.intermediate_size
    shared = int(t.get("n_shared_experts") or 0) * 3 * h * moe_inter
    shared += 3 * h * int(t.get("shared_expert_intermediate_size") or 0)
    router = len(moe_layers) * experts * (h + (1 if moe and moe.router_bias else 0))
    norms = n_layers * 2 * h + h
    vision = _vision_params(target.config.get("vision_config"), h)
    return ParamCounts(
        attention=_attention_params(target),
        dense_mlp=3 * h * spec.intermediate_size,
        shared_experts=shared,
        experts=len(moe_layers) * experts * 3 * h * moe_inter,
        moe_layers=moe_layers,
        num_layers=n_layers,
        unquantized=router + norms + v * h + vision,
        lm_head=0 if spec.tie_word_embeddings else v * h,
    )


# --------------------------------------------------------------------------- bytes


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


def estimate_target_weights(target: TargetInfo) -> WeightEstimate:
    """Weight memory of the target as vLLM loads it (from the config, not the files)."""
    config, spec = target.config, target.spec
    prefix = spec.weight_prefix or "model."
    dtype_bytes = DTYPE_BYTES.get(str(spec.torch_dtype), 2)
    c = count_params(target)

    def lin(module: str) -> float:
        return linear_weight_bytes(config, prefix + module, dtype_bytes)

    moe_l, dense_l = (c.moe_layers[0] if c.moe_layers else 0), 0
    expert_bytes = c.experts * lin(f"layers.{moe_l}.mlp.experts.0.gate_proj")
    dense_bytes = (
        c.num_layers * c.attention * lin(f"layers.{dense_l}.self_attn.o_proj")
        + c.num_dense * c.dense_mlp * lin(f"layers.{dense_l}.mlp.gate_proj")
        + len(c.moe_layers) * c.shared_experts * lin(f"layers.{moe_l}.mlp.shared_experts.gate_proj")
        + c.lm_head * linear_weight_bytes(config, "lm_head", dtype_bytes)
        + c.unquantized * dtype_bytes
    )
    q = _quant_config(config)
    label = "none" if not q else str(q.get("quant_method"))
    if c.experts and expert_bytes < c.experts * dtype_bytes:
        label += f" ({expert_bytes / c.experts * 8:.2f} bits per expert weight)"
    return WeightEstimate(
        params=int(c.total),
        expert_params=int(c.experts),
        bytes_total=expert_bytes + dense_bytes,
        expert_bytes=expert_bytes,
        dense_bytes=dense_bytes,
        quantization=label,
    )


# --------------------------------------------------------------------------- per GPU


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
