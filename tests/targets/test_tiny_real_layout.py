"""The tiny Kimi-K2.5 is held to the real checkpoint's layout (tests/fixtures/kimi_k25), so
vLLM loads it the way it loads the real one: same config keys (recursively), same weight
names up to layer/expert indices and the INT4 suffixes, the real architecture name, the
routing fields, the placeholder id, MLA dims the CPU MLA kernel accepts and yarn rope."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "kimi_k25"

# The real checkpoint is INT4 and loads its classes as remote code; the tiny one is
# float32 and uses transformers' native kimi_k25 classes. Nothing else may be missing.
NOT_MIRRORED = {"quantization_config", "auto_map"}
# Keys transformers' native classes need beside the real ones (read by transformers and
# vLLM; the real config spells some of them vt_* / rope_scaling).
TRANSFORMERS_ONLY = {
    "image_token_id",
    "video_token_id",
    "vision_start_token_id",
    "vision_end_token_id",
    "projection_hidden_size",
    "projection_layer_norm_eps",
    "vision_config.hidden_size",
    "vision_config.intermediate_size",
    "vision_config.num_attention_heads",
    "vision_config.num_hidden_layers",
    "vision_config.hidden_act",
    "vision_config.pos_emb_height",
    "vision_config.pos_emb_width",
    "vision_config.pos_emb_time",
    "vision_config.rope_parameters",
    "text_config.head_dim",
    "text_config.qk_head_dim",
    "text_config.rope_interleave",
    "text_config.pretraining_tp",
    "text_config.output_router_logits",
}


def _keys(d: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in d.items():
        out.add(prefix + k)
        if isinstance(v, dict) and k not in ("rope_scaling", "rope_parameters"):
            out |= _keys(v, f"{prefix}{k}.")
    return out


_INDEX = re.compile(r"\.\d+\.")
_INT4 = re.compile(r"\.(weight_packed|weight_scale|weight_shape|weight_zero_point)$")


def _patterns(names) -> set[str]:
    return {_INT4.sub(".weight", _INDEX.sub(".N.", n)) for n in names}


def _tiny(tiny_target: Path) -> Path:
    spec = json.loads((tiny_target / "data/target/target.json").read_text())
    return tiny_target / spec["path"]


def test_tiny_config_has_every_key_of_the_real_one(tiny_target):
    real = json.loads((FIXTURE / "config.json").read_text())
    tiny = json.loads((_tiny(tiny_target) / "config.json").read_text())
    want = {k for k in _keys(real) if k.split(".")[0] not in NOT_MIRRORED}
    have = _keys(tiny)
    assert want - have == set(), "keys of the real config missing from the tiny one"
    extra = have - _keys(real)
    assert extra <= TRANSFORMERS_ONLY, f"unexpected keys: {sorted(extra - TRANSFORMERS_ONLY)}"


def test_tiny_config_values_vllm_reads(tiny_target):
    real = json.loads((FIXTURE / "config.json").read_text())
    tiny = json.loads((_tiny(tiny_target) / "config.json").read_text())
    assert tiny["architectures"] == real["architectures"] == ["KimiK25ForConditionalGeneration"]
    t, r = tiny["text_config"], real["text_config"]
    for key in ("topk_method", "scoring_func", "model_type"):
        assert t[key] == r[key], key
    # the only latent width vLLM's CPU MLA kernel accepts; the real model's
    assert t["kv_lora_rank"] + t["qk_rope_head_dim"] == 576
    assert t["rope_scaling"]["type"] == r["rope_scaling"]["type"] == "yarn"
    assert set(t["rope_scaling"]) == set(r["rope_scaling"])
    assert tiny["media_placeholder_token_id"] == tiny["image_token_id"] < t["vocab_size"]
    assert t["hidden_size"] <= 256 and t["num_hidden_layers"] <= 8  # still tiny
    pre = json.loads((_tiny(tiny_target) / "preprocessor_config.json").read_text())
    assert {"patch_size", "merge_kernel_size", "image_mean", "image_std", "in_patch_limit"} <= set(
        pre["media_proc_cfg"]
    )


def test_tiny_weight_names_follow_the_real_index(tiny_target):
    real = json.loads((FIXTURE / "model.safetensors.index.json").read_text())["weight_map"]
    tiny = json.loads((_tiny(tiny_target) / "model.safetensors.index.json").read_text())
    assert _patterns(tiny["weight_map"]) == _patterns(real)
