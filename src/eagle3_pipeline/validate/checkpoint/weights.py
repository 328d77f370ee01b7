"""The weight rules: the tensor names, shapes and dtypes vLLM's ``llama_eagle3`` (and, for
an MLA draft, ``deepseek_eagle3``) loads.

vLLM leaves a parameter the checkpoint lacks uninitialised without a word and fails the
load on a name it has no parameter for, so both directions are checked against the
shapes the config implies. Only safetensors headers are read here (via
:func:`eagle3_pipeline.core.safetensors.read_header`); the values are
:mod:`eagle3_pipeline.validate.checkpoint.values`' concern.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from eagle3_pipeline.core.errors import ConfigError
from eagle3_pipeline.core.safetensors import TensorInfo, read_header
from eagle3_pipeline.draft.layers import DRAFT_LAYERS
from eagle3_pipeline.validate.checkpoint.config import CheckpointShape
from eagle3_pipeline.validate.checkpoint.report import Report

# vLLM's renames applied to checkpoint names before matching parameters.
VLLM_RENAMES = (("midlayer.", "layers.0."),)
# Saved by older speculators / other trainers, rejected by vLLM as unknown parameters.
TRAINING_ONLY_TENSORS = ("verifier_lm_head.weight", "verifier_norm.weight")
# Rotary buffers some trainers save: vLLM's AutoWeightsLoader drops them by name.
VLLM_DROPPED_SUFFIXES = (
    "rotary_pos_emb.inv_freq",
    "rotary_emb.inv_freq",
    "rotary_emb.cos_cached",
    "rotary_emb.sin_cached",
)

FLOAT_DTYPES = ("F32", "F16", "BF16")
SAFETENSORS_INDEX = "model.safetensors.index.json"

# name -> (shape, dtype kind: float | int64 | bool)
Expected = dict[str, tuple[list[int], str]]


@dataclass
class StoredTensor:
    """One tensor of the draft and the file it is stored in."""

    name: str  # as stored in the file
    dtype: str
    shape: list[int]
    file: str


# --------------------------------------------------------------------------- reading


def read_weight_headers(report: Report, draft_dir: Path) -> dict[str, StoredTensor] | None:
    """Tensor names, dtypes and shapes from the headers (sharded with index, or single)."""
    index_path = draft_dir / SAFETENSORS_INDEX
    if index_path.is_file():
        return _read_indexed(report, draft_dir, index_path)
    return _read_unindexed(report, draft_dir)


def _read_indexed(
    report: Report, draft_dir: Path, index_path: Path
) -> dict[str, StoredTensor] | None:
    """Shards through the index, which vLLM trusts: both sides must list the same names."""
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        weight_map = index["weight_map"]
        assert isinstance(weight_map, dict)
    except (json.JSONDecodeError, KeyError, AssertionError, UnicodeDecodeError) as exc:
        report.error("weights-index", SAFETENSORS_INDEX, f"unreadable weight index ({exc})")
        return None
    headers: dict[str, dict[str, TensorInfo]] = {}
    for shard in sorted(set(weight_map.values())):
        path = draft_dir / shard
        if not path.is_file():
            report.error("weights-index", shard, f"listed in {SAFETENSORS_INDEX} but missing")
            continue
        headers[shard] = _header(report, path)
    tensors: dict[str, StoredTensor] = {}
    for name, shard in weight_map.items():
        if shard not in headers:
            continue
        meta = headers[shard].get(name)
        if meta is None:
            report.error(
                "weights-index",
                f"{shard}:{name}",
                f"in {SAFETENSORS_INDEX} but not in the shard",
            )
            continue
        tensors[name] = StoredTensor(name, meta.dtype, list(meta.shape), shard)
    for shard, header in headers.items():
        for name in set(header) - set(weight_map):
            report.error(
                "weights-index",
                f"{shard}:{name}",
                f"in the shard but not in {SAFETENSORS_INDEX} (vLLM would not load it)",
            )
    return tensors


def _read_unindexed(report: Report, draft_dir: Path) -> dict[str, StoredTensor] | None:
    files = sorted(draft_dir.glob("*.safetensors"))
    if not files:
        other = sorted(p.name for p in draft_dir.glob("*.bin"))
        hint = f" (found {', '.join(other)}; save with safetensors)" if other else ""
        report.error("weights-missing", str(draft_dir), f"no *.safetensors weights{hint}")
        return None
    if len(files) > 1:
        report.warning(
            "weights-index",
            str(draft_dir),
            f"{len(files)} safetensors files without {SAFETENSORS_INDEX}",
        )
    tensors: dict[str, StoredTensor] = {}
    for path in files:
        for name, meta in _header(report, path).items():
            if name in tensors:
                report.error(
                    "tensor-duplicate", f"{path.name}:{name}", f"also in {tensors[name].file}"
                )
            tensors[name] = StoredTensor(name, meta.dtype, list(meta.shape), path.name)
    return tensors


def _header(report: Report, path: Path) -> dict[str, TensorInfo]:
    try:
        return read_header(path)
    except ConfigError as exc:  # an unreadable header is one finding, not a crash
        report.error("weights-unreadable", path.name, f"cannot read safetensors header ({exc})")
        return {}


# --------------------------------------------------------------------------- expectations


def expected_tensors(shape: CheckpointShape) -> tuple[Expected, set[str]]:
    """(required name -> (shape, dtype kind), optional names) as vLLM's llama_eagle3 loads."""
    h, ht = shape.hidden, shape.target_hidden
    req: Expected = {
        "fc.weight": ([h, shape.n_aux * ht], "float"),
        "norm.weight": ([h], "float"),
        "lm_head.weight": ([shape.draft_vocab, h], "float"),
    }
    optional: Expected = {
        "embed_tokens.weight": ([shape.vocab, h], "float"),
        "t2d": ([shape.vocab], "bool"),
    }
    # d2t is needed when the draft vocabulary is a subset of the target's, and refused
    # when it is the whole vocabulary: vLLM then builds no draft_id_to_target_id.
    if shape.draft_vocab != shape.vocab:
        req["d2t"] = ([shape.draft_vocab], "int64")
    for i in range(shape.layers):
        layer_req, layer_opt = _layer_tensors(shape, i)
        req.update(layer_req)
        optional.update(layer_opt)
    # The llama draft skips input_norm unless norm_before_fc asks for it; the MLA draft has
    # no input_norm and does not skip it (the load fails).
    if shape.mla is None:
        (req if shape.norm_before_fc else optional)["input_norm.weight"] = (
            [shape.n_aux * ht],
            "float",
        )
    if shape.fc_norm:
        for i in range(shape.n_aux):
            req[f"fc_norm.{i}.weight"] = ([ht], "float")
    return {**req, **optional}, set(optional)


def _layer_tensors(shape: CheckpointShape, i: int) -> tuple[Expected, Expected]:
    """(required, optional) tensors of decoder layer ``i``; layer 0 reads [embeds, hidden]."""
    h, hd, p = shape.hidden, shape.head_dim, f"layers.{i}."
    width = 2 * h if i == 0 else h
    req: Expected = {}
    if shape.mla is not None:
        req.update(_mla_attention_tensors(shape, f"{p}self_attn.", width))
    else:
        attn = {
            "q_proj": [shape.heads * hd, width],
            "k_proj": [shape.kv_heads * hd, width],
            "v_proj": [shape.kv_heads * hd, width],
            "o_proj": [h, shape.heads * hd],
        }
        _add_linear(req, f"{p}self_attn.", attn, shape.attention_bias)
    mlp = {
        "gate_proj": [shape.intermediate, h],
        "up_proj": [shape.intermediate, h],
        "down_proj": [h, shape.intermediate],
    }
    _add_linear(req, f"{p}mlp.", mlp, shape.mlp_bias)
    req[f"{p}input_layernorm.weight"] = ([h], "float")
    req[f"{p}post_attention_layernorm.weight"] = ([h], "float")
    # vLLM builds hidden_norm in every layer but only layer 0 uses it; speculators
    # writes it for layer 0 only.
    optional: Expected = {}
    (req if i == 0 else optional)[f"{p}hidden_norm.weight"] = ([h], "float")
    if DRAFT_LAYERS[shape.layer_type].qk_norm:
        req[f"{p}self_attn.q_norm.weight"] = ([hd], "float")
        req[f"{p}self_attn.k_norm.weight"] = ([hd], "float")
    return req, optional


def _mla_attention_tensors(shape: CheckpointShape, prefix: str, width: int) -> Expected:
    """vLLM's ``DeepseekV2MLAAttention`` over an input ``width`` wide: the low-rank q path
    (or one ``q_proj``), the joint latent + rope projection, the latent norm, the per-head
    key/value up projection and the output projection."""
    m, heads = shape.mla, shape.heads
    assert m is not None
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    out: Expected = {}
    if m.q_lora_rank is None:
        out[f"{prefix}q_proj.weight"] = ([heads * qk, width], "float")
    else:
        out[f"{prefix}q_a_proj.weight"] = ([m.q_lora_rank, width], "float")
        out[f"{prefix}q_a_layernorm.weight"] = ([m.q_lora_rank], "float")
        out[f"{prefix}q_b_proj.weight"] = ([heads * qk, m.q_lora_rank], "float")
    out[f"{prefix}kv_a_proj_with_mqa.weight"] = (
        [m.kv_lora_rank + m.qk_rope_head_dim, width],
        "float",
    )
    out[f"{prefix}kv_a_layernorm.weight"] = ([m.kv_lora_rank], "float")
    out[f"{prefix}kv_b_proj.weight"] = (
        [heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank],
        "float",
    )
    out[f"{prefix}o_proj.weight"] = ([shape.hidden, heads * m.v_head_dim], "float")
    return out


def _add_linear(out: Expected, prefix: str, shapes: dict[str, list[int]], bias: bool) -> None:
    for proj, s in shapes.items():
        out[f"{prefix}{proj}.weight"] = (s, "float")
        if bias:
            out[f"{prefix}{proj}.bias"] = ([s[0]], "float")


def vllm_name(name: str) -> str:
    """The name vLLM's loader matches after its renames."""
    for old, new in VLLM_RENAMES:
        if old in name:
            name = name.replace(old, new)
    return name


# --------------------------------------------------------------------------- rules


def _fmt_shape(shape: Iterable[int]) -> str:
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def check_weights(
    report: Report, tensors: dict[str, StoredTensor], shape: CheckpointShape | None
) -> dict[str, StoredTensor]:
    """Presence, unknown names, shapes and dtypes; returns tensors by vLLM name."""
    by_vllm: dict[str, StoredTensor] = {}
    for name, info in tensors.items():
        mapped = vllm_name(name)
        if mapped != name:
            report.info("tensor-renamed", name, f"vLLM loads it as {mapped}")
        by_vllm[mapped] = info
    report.facts["tensors"] = len(tensors)
    if shape is None:
        report.info(
            "weights-skipped",
            "config.json",
            "tensor shapes not checked: the config does not define them",
        )
        return by_vllm
    wanted, optional = expected_tensors(shape)
    for name, (want_shape, kind) in wanted.items():
        found = by_vllm.get(name)
        if found is not None:
            _check_tensor(report, found, want_shape, kind)
        elif name not in optional:
            report.error(
                "tensor-missing",
                name,
                f"missing (expected {_fmt_shape(want_shape)}): vLLM would leave it "
                "uninitialised without an error",
            )
    _check_float_dtypes(report, tensors)
    for name in sorted(set(by_vllm) - set(wanted)):
        _report_unknown(report, name, by_vllm[name], shape)
    if shape.mla is None and not shape.norm_before_fc and "input_norm.weight" in by_vllm:
        report.warning(
            "input-norm-dropped",
            "input_norm.weight",
            "norm_before_fc is off, so vLLM drops this norm: if the draft was trained with it, "
            "set norm_before_fc",
        )
    if "embed_tokens.weight" not in by_vllm:
        report.info(
            "embed-tokens", "embed_tokens.weight", "not saved: vLLM shares the target's embeddings"
        )
    return by_vllm


def _check_tensor(report: Report, info: StoredTensor, want_shape: list[int], kind: str) -> None:
    where = f"{info.file}:{info.name}"
    if info.shape != want_shape:
        report.error(
            "tensor-shape",
            where,
            f"shape {_fmt_shape(info.shape)}, expected {_fmt_shape(want_shape)}",
        )
    if kind == "float" and info.dtype not in FLOAT_DTYPES:
        report.error("tensor-dtype", where, f"dtype {info.dtype}, expected F32/F16/BF16")
    elif kind == "int64" and info.dtype != "I64":
        report.error(
            "tensor-dtype",
            where,
            f"dtype {info.dtype}, expected I64 (vLLM's draft_id_to_target_id)",
        )
    elif kind == "bool" and info.dtype != "BOOL":
        report.warning(
            "tensor-dtype", where, f"dtype {info.dtype}, expected BOOL (vLLM ignores t2d)"
        )


def _check_float_dtypes(report: Report, tensors: dict[str, StoredTensor]) -> None:
    """vLLM casts to one dtype; a mix usually means a half-converted checkpoint."""
    float_dtypes = sorted({i.dtype for i in tensors.values() if i.dtype in FLOAT_DTYPES})
    if len(float_dtypes) > 1:
        report.warning("tensor-dtype", "model weights", f"mixed float dtypes {float_dtypes}")
    report.facts["dtype"] = float_dtypes[0] if len(float_dtypes) == 1 else float_dtypes


def _report_unknown(report: Report, name: str, info: StoredTensor, shape: CheckpointShape) -> None:
    """A tensor vLLM has no parameter for: its loader fails on it, except the few the llama
    draft's loader skips (``mask_hidden``; ``input_norm`` is expected then)."""
    where = f"{info.file}:{info.name}"
    mla = shape.mla is not None
    if name in TRAINING_ONLY_TENSORS:
        report.error(
            "tensor-unknown",
            where,
            "training-only tensor: vLLM has no such parameter and fails the load "
            "(speculators' save_pretrained drops it)",
        )
    elif name == "d2t":
        report.error(
            "tensor-unknown",
            where,
            f"draft_vocab_size = vocab_size = {shape.vocab}: vLLM builds no "
            "draft_id_to_target_id for a draft over the whole vocabulary and fails the load "
            "on d2t (drop it; vLLM ignores t2d)",
        )
    elif any(s in name for s in VLLM_DROPPED_SUFFIXES):
        report.warning("tensor-unknown", where, "a rotary buffer: vLLM drops it by name")
    elif name.endswith(".bias"):
        report.error(
            "tensor-unknown",
            where,
            "vLLM has no such bias and ignores it without a word: the draft would be served "
            "without it",
        )
    elif name == "mask_hidden" and not mla:
        report.warning(
            "tensor-unknown",
            where,
            "parallel-drafting tensor: vLLM skips it unless parallel drafting is on",
        )
    elif mla and name in ("input_norm.weight", "mask_hidden"):
        report.error(
            "tensor-unknown",
            where,
            "vLLM's MLA draft (deepseek_eagle3) has no such parameter and, unlike its llama "
            "draft, does not skip it: the load fails",
        )
    else:
        report.error("tensor-unknown", where, "vLLM has no such parameter and fails the load")
