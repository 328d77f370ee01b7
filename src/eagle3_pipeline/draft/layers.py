"""The draft's decoder-layer types, declared once: the ones speculators builds an EAGLE-3
draft from *and* vLLM serves. The schema's choice (``core.choices.DraftLayerType``, so
Hydra refuses another value at compose) names them; this table says what each one is,
and must cover exactly that choice (checked at import). The checkpoint validator's
``transformer_layer_config.model_type`` rule, the parameter count and the expected
tensors all read this table).

Both libraries key the type by the layer config's ``model_type``: speculators' training
CLI maps it to a transformers config class, vLLM's speculators-config reader to its
``Eagle3<Type>ForCausalLM``. ``tests/test_compat.py`` and ``tests/test_vllm_compat.py``
fail when either library's list stops containing one of these.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_pipeline.core.choices import DraftLayerType


@dataclass(frozen=True)
class DraftLayerKind:
    """What differs between draft layer types, for the code that sizes or checks them."""

    # The layer config's model_type (speculators' draft_arch, vLLM's arch-map key).
    name: str
    # transformers' config class, as module:attribute (imported only when a config is built).
    config_class: str
    # Per-head RMSNorms on queries and keys (tensors self_attn.q_norm / k_norm, head_dim each).
    qk_norm: bool


DRAFT_LAYERS: dict[str, DraftLayerKind] = {
    k.name: k
    for k in (
        DraftLayerKind(
            "llama", "transformers.models.llama.configuration_llama:LlamaConfig", qk_norm=False
        ),
        DraftLayerKind(
            "qwen3", "transformers.models.qwen3.configuration_qwen3:Qwen3Config", qk_norm=True
        ),
    )
}
if set(DRAFT_LAYERS) != {t.value for t in DraftLayerType}:  # pragma: no cover - a dev error
    raise ImportError("draft.layers.DRAFT_LAYERS must describe every DraftLayerType")


def config_class(kind: DraftLayerKind) -> type:
    """transformers' config class for ``kind`` (imported here: transformers is heavy)."""
    import importlib

    module, _, attr = kind.config_class.partition(":")
    return getattr(importlib.import_module(module), attr)
