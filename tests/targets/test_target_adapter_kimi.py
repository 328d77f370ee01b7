"""The target adapter against a config-only replica of moonshotai/Kimi-K2.5."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3_pipeline.core.choices import Dtype
from eagle3_pipeline.core.config import ConfigError, ModelConfig
from eagle3_pipeline.targets.adapter import describe_config, describe_target, read_weight_names

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "kimi_k25"


def kimi_model(**kw) -> ModelConfig:
    return ModelConfig(
        name="kimi_k25",
        path=str(FIXTURE),
        hub_id="moonshotai/Kimi-K2.5",
        trust_remote_code=True,
        dtype=Dtype.bfloat16,
        **kw,
    )


def test_fixture_has_the_traps_of_the_real_config():
    cfg = json.loads((FIXTURE / "config.json").read_text())
    assert cfg["model_type"] == "kimi_k25" and "hidden_size" not in cfg
    assert cfg["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert set(cfg["auto_map"]) >= {"AutoConfig", "AutoModel"}
    assert cfg["tie_word_embeddings"] is False
    assert cfg["quantization_config"]["quant_method"] == "compressed-tensors"
    text = cfg["text_config"]
    assert text["model_type"] == "deepseek_v3" and text["intermediate_size"] == 18432
    names = read_weight_names(FIXTURE)
    assert not any(".blocks." in n and n.startswith("language_model") for n in names)
    for layer in (0, 60):
        assert f"language_model.model.layers.{layer}.self_attn.kv_b_proj.weight" in names
    layer60_experts = {n.split(".")[6] for n in names if ".layers.60.mlp.experts." in n}
    assert len(layer60_experts) == 384


def test_describe_kimi():
    spec = describe_target(FIXTURE, kimi_model())
    assert spec.nested and spec.text_config_key == "text_config"
    assert spec.model_type == "kimi_k25" and spec.text_model_type == "deepseek_v3"
    assert (spec.num_layers, spec.hidden_size, spec.vocab_size) == (61, 7168, 163840)
    assert spec.attention == "mla" and spec.head_dim == 128 + 64
    assert spec.num_attention_heads == 64
    assert spec.moe and spec.num_experts == 384
    assert spec.aux_layer_ids == [2, 30, 58] and spec.aux_layer_ids_source == "adapter default"
    assert spec.architecture == spec.vllm_architecture == "KimiK25ForConditionalGeneration"
    assert spec.vllm_eagle3_supported
    assert spec.quantization == "compressed-tensors"
    assert spec.tie_word_embeddings is False
    assert spec.weights == {
        "embed_tokens": "language_model.model.embed_tokens.weight",
        "lm_head": "language_model.lm_head.weight",
        "final_norm": "language_model.model.norm.weight",
    }
    assert spec.weight_prefix == "language_model.model."
    assert spec.torch_dtype == "bfloat16"
    assert spec.max_position_embeddings == 262144
    assert spec.trust_remote_code and spec.hub_id == "moonshotai/Kimi-K2.5"


def test_transformers_architecture_name_maps_to_vllm_name():
    cfg = json.loads((FIXTURE / "config.json").read_text())
    cfg["architectures"] = ["Kimi_K25ForConditionalGeneration"]  # what transformers writes
    spec = describe_config(cfg, kimi_model())
    assert spec.vllm_architecture == "KimiK25ForConditionalGeneration"
    assert spec.vllm_eagle3_supported


def test_top_level_untied_overrides_a_nested_default():
    cfg = json.loads((FIXTURE / "config.json").read_text())
    del cfg["text_config"]["tie_word_embeddings"]
    spec = describe_config(cfg, kimi_model(), read_weight_names(FIXTURE))
    assert spec.tie_word_embeddings is False
    assert spec.weights["lm_head"] == "language_model.lm_head.weight"


def test_configured_aux_layers_are_validated_against_61_layers():
    spec = describe_target(FIXTURE, kimi_model(aux_layer_ids=[1, 31, 60]))
    assert spec.aux_layer_ids == [1, 31, 60] and spec.aux_layer_ids_source == "config"
    with pytest.raises(ConfigError, match="out of range for a 61-layer target"):
        describe_target(FIXTURE, kimi_model(aux_layer_ids=[2, 30, 61]))


def test_missing_lm_head_is_refused_for_untied_kimi(tmp_path):
    index = json.loads((FIXTURE / "model.safetensors.index.json").read_text())
    del index["weight_map"]["language_model.lm_head.weight"]
    (tmp_path / "config.json").write_text((FIXTURE / "config.json").read_text())
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match="no lm_head weight found"):
        describe_target(tmp_path, kimi_model())
