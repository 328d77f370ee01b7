"""DeepSeek-V3 (and the text model Kimi-K2.5 nests): MLA attention, DeepSeek MoE.

Its MoE layout: the first ``first_k_dense_replace`` layers are dense, then every
``moe_layer_freq``-th is MoE; routed experts are ``n_routed_experts`` wide
``moe_intermediate_size`` MLPs, plus ``n_shared_experts`` always-on ones, and the router
carries one ``e_score_correction_bias`` per expert (``topk_method: noaux_tc``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eagle3_pipeline.targets.families.base import Family, MoeLayout, first_k_dense_layout

if TYPE_CHECKING:
    from eagle3_pipeline.core.config import TinyModelConfig

DEEPSEEK_MOE = MoeLayout(("n_routed_experts",), first_k_dense_layout, router_bias=True)


def tiny_text_config(tiny: TinyModelConfig) -> dict[str, Any]:
    """The MLA and MoE keys of a tiny DeepSeek-V3 text model (kimi_k25 nests one)."""
    return {
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
    }


FAMILY = Family(
    name="deepseek_v3",
    model_types=("deepseek_v3",),
    architectures=("DeepseekV3ForCausalLM",),
    vllm_architecture="DeepseekV3ForCausalLM",
    vllm_eagle3=True,
    moe=DEEPSEEK_MOE,
    end_of_turn="<｜end▁of▁sentence｜>",
    reasoning_markers=("<think>", "</think>"),  # R1 / V3.1 thinking mode
)
