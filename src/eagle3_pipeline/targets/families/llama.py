"""Llama (2/3): the plain flat decoder the pipeline's generic path is written for.

The tiny Llama proves nothing in the pipeline is Kimi-specific: same tokenizer, corpus and
training as the tiny Kimi, a flat ``model.`` checkpoint and grouped-query attention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eagle3_pipeline.targets.families.base import Family, TinyBuilder, tiny_common_config

if TYPE_CHECKING:
    from eagle3_pipeline.core.config import TinyModelConfig


def _kv_heads(tiny: TinyModelConfig) -> int:
    return max(1, tiny.num_heads // 2)


def build_tiny(shape: TinyModelConfig, common: dict[str, Any], tokenizer: Any) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(num_key_value_heads=_kv_heads(shape), **common))


def tiny_config(tiny: TinyModelConfig) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "num_key_value_heads": _kv_heads(tiny),
        **tiny_common_config(tiny),
    }


FAMILY = Family(
    name="llama",
    model_types=("llama",),
    architectures=("LlamaForCausalLM",),
    vllm_architecture="LlamaForCausalLM",
    vllm_eagle3=True,
    end_of_turn="<|eot_id|>",  # Llama 3
    tiny=TinyBuilder(build=build_tiny, config=tiny_config),
)
