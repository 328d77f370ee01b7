"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): a flat Qwen3 decoder whose MLPs are
mixtures of experts on every ``decoder_sparse_step``-th layer.

Its MoE layout differs from DeepSeek's: layer i is MoE when ``(i + 1) %
decoder_sparse_step == 0`` and i is not in ``mlp_only_layers``; there are no shared
experts and the router has no bias. The expert count is ``num_experts`` in the real
``config.json`` and ``num_local_experts`` as transformers 5 writes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eagle3_pipeline.targets.families.base import (
    Family,
    MoeLayout,
    TinyBuilder,
    sparse_step_layout,
    tiny_common_config,
    tiny_rope_parameters,
)

if TYPE_CHECKING:
    from eagle3_pipeline.core.config import TinyModelConfig

# The tiny target's layout: dense and MoE layers alternate (1 and 3 of 4 are MoE), so both
# MLP kinds are built, saved, extracted from and served. model.tiny has no key for it.
TINY_DECODER_SPARSE_STEP = 2


def tiny_moe_config(tiny: TinyModelConfig) -> dict[str, Any]:
    """The attention and MoE keys of the tiny Qwen3-MoE (transformers' spelling)."""
    return {
        "num_key_value_heads": max(1, tiny.num_heads // 2),
        "head_dim": tiny.hidden_size // tiny.num_heads,
        "num_experts": tiny.n_routed_experts,
        "num_experts_per_tok": tiny.num_experts_per_tok,
        "moe_intermediate_size": tiny.moe_intermediate_size,
        "decoder_sparse_step": TINY_DECODER_SPARSE_STEP,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
    }


def build_tiny(shape: TinyModelConfig, common: dict[str, Any], tokenizer: Any) -> Any:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        **tiny_moe_config(shape), rope_parameters=tiny_rope_parameters(shape), **common
    )
    return Qwen3MoeForCausalLM(cfg)


def tiny_config(tiny: TinyModelConfig) -> dict[str, Any]:
    return {
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        **tiny_moe_config(tiny),
        **tiny_common_config(tiny),
    }


FAMILY = Family(
    name="qwen3_moe",
    model_types=("qwen3_moe",),
    architectures=("Qwen3MoeForCausalLM",),
    vllm_architecture="Qwen3MoeForCausalLM",
    vllm_eagle3=True,
    moe=MoeLayout(("num_experts", "num_local_experts"), sparse_step_layout),
    qk_norm=True,
    end_of_turn="<|im_end|>",
    reasoning_markers=("<think>", "</think>"),
    tiny=TinyBuilder(build=build_tiny, config=tiny_config),
)
