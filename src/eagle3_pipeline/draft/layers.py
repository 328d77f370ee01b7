"""The draft's decoder-layer types, declared once: the ones speculators builds an EAGLE-3
draft from *and* vLLM serves. The schema's choice (``core.choices.DraftLayerType``, so
Hydra refuses another value at compose) names them; this table says what each one is,
and must cover exactly that choice (checked at import). The checkpoint validator's
``transformer_layer_config.model_type`` rule, the parameter count and the expected
tensors all read this table).

Both libraries key the type by the layer config's ``model_type``: speculators' training
CLI maps it to a transformers config class, vLLM's speculators-config reader to its
``Eagle3<Type>ForCausalLM``. ``tests/compat/test_compat.py`` and ``tests/compat/test_vllm_compat.py``
fail when either library's list stops containing one of these.

``mla`` is ours: speculators has no MLA layer (``draft/mla.py`` registers one) and vLLM
serves it from a plain DeepSeek config, not from speculators' format
(``draft/mla_format.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_pipeline.core.choices import DraftLayerType


@dataclass(frozen=True)
class DraftLayerKind:
    """What differs between draft layer types, for the code that sizes or checks them."""

    # The choice (train.draft.layer_type).
    name: str
    # transformers' config class, as module:attribute (imported only when a config is built).
    config_class: str
    # Per-head RMSNorms on queries and keys (tensors self_attn.q_norm / k_norm, head_dim each).
    qk_norm: bool
    # The layer config's model_type (speculators' draft_arch, vLLM's arch-map key).
    model_type: str = ""
    # Multi-head latent attention, saved in vLLM's plain DeepSeek format.
    mla: bool = False

    @property
    def layer_model_type(self) -> str:
        return self.model_type or self.name


DRAFT_LAYERS: dict[str, DraftLayerKind] = {
    k.name: k
    for k in (
        DraftLayerKind(
            "llama", "transformers.models.llama.configuration_llama:LlamaConfig", qk_norm=False
        ),
        DraftLayerKind(
            "qwen3", "transformers.models.qwen3.configuration_qwen3:Qwen3Config", qk_norm=True
        ),
        DraftLayerKind(
            "mla",
            "transformers.models.deepseek_v3.configuration_deepseek_v3:DeepseekV3Config",
            qk_norm=False,
            model_type="deepseek_v3",
            mla=True,
        ),
    )
}
if set(DRAFT_LAYERS) != {t.value for t in DraftLayerType}:  # pragma: no cover - a dev error
    raise ImportError("draft.layers.DRAFT_LAYERS must describe every DraftLayerType")


def kind_for_model_type(model_type: str) -> DraftLayerKind | None:
    """The kind whose layer config carries ``model_type`` (what a saved config says)."""
    return next((k for k in DRAFT_LAYERS.values() if k.layer_model_type == model_type), None)


def config_class(kind: DraftLayerKind) -> type:
    """transformers' config class for ``kind`` (imported here: transformers is heavy)."""
    import importlib

    module, _, attr = kind.config_class.partition(":")
    return getattr(importlib.import_module(module), attr)
