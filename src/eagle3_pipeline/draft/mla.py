"""The MLA draft layer: one DeepSeek-V3 (multi-head latent attention) decoder layer as
EAGLE-3's first layer, the draft the field trains for Kimi-K2.5.

Why here: speculators 0.9 builds EAGLE-3 drafts from llama or qwen3 layers only. Its
``Eagle3DraftModel`` looks the layer classes up by the layer config's ``model_type``
(``speculators.models.eagle3.model_definitions.model_classes``), so an MLA draft is one
more entry there -- registered by :func:`eagle3_pipeline.compat.speculators.register_mla_layer`
-- and everything else (the TTT unroll, the losses, the vocabulary mapping, packed
attention over documents) stays speculators' own.

The layer is transformers' ``DeepseekV3DecoderLayer`` (its ``DeepseekV3Attention`` caches
the compressed latents, which is what lets speculators' TTT steps attend to the earlier
steps' keys), with the EAGLE-3 changes speculators makes to a llama layer: the projections
that read the input (``q_a_proj`` or ``q_proj``, and ``kv_a_proj_with_mqa``) take the
concatenation ``[embeddings, hidden]`` (2 x hidden wide), a ``hidden_norm`` normalises the
hidden half, and the residual is the hidden half. The MLP is always dense. These are the
shapes vLLM's ``deepseek_eagle3.py`` (``Eagle3DeepseekV2ForCausalLM``) builds and serves.

Rope: transformers' ``rope_interleave`` permutes the rope channels of q and k alike before
rotating, vLLM rotates adjacent pairs in place (``is_neox_style=False``); the dot products
are the same, so one set of weights serves in both.
"""

from __future__ import annotations

from typing import Any

# The draft layer config's model_type: transformers' DeepseekV3Config (interleaved rope,
# latent KV cache). vLLM serves the draft from a plain config whose model_type is
# SERVED_MODEL_TYPE instead (see draft/mla_format.py).
LAYER_MODEL_TYPE = "deepseek_v3"


def first_layer_class() -> type:
    """``MlaEagle3FirstLayer``, built on first use (transformers and speculators are heavy)."""
    global _FIRST_LAYER
    if _FIRST_LAYER is None:
        _FIRST_LAYER = _build_first_layer_class()
    return _FIRST_LAYER


_FIRST_LAYER: type | None = None


def _build_first_layer_class() -> type:
    import torch
    from speculators.models.eagle3.model_definitions import Eagle3FirstLayerMixin
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3DecoderLayer,
        DeepseekV3RMSNorm,
    )

    class MlaEagle3FirstLayer(Eagle3FirstLayerMixin, DeepseekV3DecoderLayer):  # type: ignore[misc]
        """EAGLE-3's first layer with MLA attention: the input projections read
        ``[embeddings, hidden]``; speculators' mixin does the split, norms and residual."""

        def __init__(self, config: Any, layer_idx: int, norm_before_residual: bool = False):
            super().__init__(config, layer_idx)
            self.norm_before_residual = norm_before_residual
            self.hidden_norm = DeepseekV3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            attn, width = self.self_attn, 2 * config.hidden_size
            if attn.q_lora_rank is None:
                attn.q_proj = torch.nn.Linear(width, attn.num_heads * attn.qk_head_dim, bias=False)
            else:
                attn.q_a_proj = torch.nn.Linear(width, attn.q_lora_rank, bias=config.attention_bias)
            attn.kv_a_proj_with_mqa = torch.nn.Linear(
                width,
                config.kv_lora_rank + config.qk_rope_head_dim,
                bias=config.attention_bias,
            )

    return MlaEagle3FirstLayer


def register() -> None:
    """Make speculators' ``Eagle3DraftModel`` build :func:`components` for a layer config
    whose model_type is :data:`LAYER_MODEL_TYPE` (idempotent)."""
    from eagle3_pipeline.compat.speculators import register_draft_layer

    register_draft_layer(LAYER_MODEL_TYPE, components())


def components() -> Any:
    """speculators' ``ModelComponents`` for the MLA draft: our first layer, transformers'
    DeepSeek-V3 layer (dense, see :func:`layer_config`) after it, its norm and rotary."""
    from speculators.models.base_components import ModelComponents
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3DecoderLayer,
        DeepseekV3RMSNorm,
        DeepseekV3RotaryEmbedding,
    )

    return ModelComponents(
        first_layer_class(), DeepseekV3DecoderLayer, DeepseekV3RMSNorm, DeepseekV3RotaryEmbedding
    )


def layer_config(
    *,
    vocab_size: int,
    hidden_size: int,
    intermediate_size: int,
    num_layers: int,
    num_attention_heads: int,
    q_lora_rank: int | None,
    kv_lora_rank: int,
    qk_nope_head_dim: int,
    qk_rope_head_dim: int,
    v_head_dim: int,
    rms_norm_eps: float,
    max_position_embeddings: int,
    rope: dict[str, Any],
) -> Any:
    """transformers' ``DeepseekV3Config`` for the draft layers: dense MLPs in every layer
    (``first_k_dense_replace`` = the layer count), interleaved rope, no MoE routing.
    ``rope``: the target's own rope keys as its config.json spells them (:func:`target_rope`)."""
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_attention_heads,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=kv_lora_rank,
        qk_nope_head_dim=qk_nope_head_dim,
        qk_rope_head_dim=qk_rope_head_dim,
        v_head_dim=v_head_dim,
        first_k_dense_replace=num_layers,
        hidden_act="silu",
        rms_norm_eps=rms_norm_eps,
        max_position_embeddings=max_position_embeddings,
        rope_interleave=True,
        attention_bias=False,
        tie_word_embeddings=False,
        **rope,
    )


ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters")


def target_rope(text_config: dict[str, Any]) -> dict[str, Any]:
    """The target's rope keys, verbatim from its (text) config.json: the draft shares the
    target's positions, and vLLM already serves these exact keys for the target."""
    return {k: text_config[k] for k in ROPE_KEYS if text_config.get(k) is not None}
