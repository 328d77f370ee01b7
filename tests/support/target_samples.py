"""The one :class:`TargetSpec` sample the tests start from, changed field by field.

Why one: three hand-written copies of its twenty-odd fields drifted apart (a field added to
``TargetSpec`` had to be added to each). The sample is Kimi-K2.5-shaped (nested multimodal
config, MLA, MoE) at the embedded tiny target's size; :data:`LLAMA` turns it into a dense
llama target and :data:`KIMI_FULL_SIZE` gives it the real model's dimensions.
"""

from __future__ import annotations

from typing import Any

from eagle3_pipeline.targets.adapter import TargetSpec

# a dense llama target (what the tiny llama tests build)
LLAMA: dict[str, Any] = dict(
    model_type="llama",
    architecture="LlamaForCausalLM",
    vllm_architecture="LlamaForCausalLM",
    nested=False,
    text_config_key=None,
    text_model_type="llama",
    attention="standard",
    moe=False,
    num_experts=0,
    rope_type="default",
)

# Kimi-K2.5's own text dimensions (61 layers, 7168 wide, 384 experts)
KIMI_FULL_SIZE: dict[str, Any] = dict(
    num_layers=61,
    hidden_size=7168,
    vocab_size=163840,
    num_attention_heads=64,
    num_key_value_heads=64,
    head_dim=192,
    intermediate_size=18432,
    num_experts=384,
    aux_layer_ids=[2, 30, 58],
    aux_layer_ids_source="config",
)


def target_spec(**changes: Any) -> TargetSpec:
    """The sample with ``changes`` (any :class:`TargetSpec` field)."""
    base: dict[str, Any] = dict(
        name="t",
        model_type="kimi_k25",
        architecture="KimiK25ForConditionalGeneration",
        vllm_architecture="KimiK25ForConditionalGeneration",
        vllm_eagle3_supported=True,
        nested=True,
        text_config_key="text_config",
        text_model_type="deepseek_v3",
        num_layers=4,
        hidden_size=128,
        vocab_size=2048,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=96,
        intermediate_size=256,
        attention="mla",
        moe=True,
        num_experts=4,
        aux_layer_ids=[1, 2, 3],
        aux_layer_ids_source="adapter default",
        rope_type="yarn",
    )
    return TargetSpec(**{**base, **changes})
