"""What the pipeline must know about a model family, as one frozen record.

Why a record and not ``if model_type == ...`` branches: the adapter, the weight estimate,
the loader and the tiny builder each need a different slice of the same family facts
(where the language model is nested, which layers are MoE, what vLLM calls the
architecture). Spread over modules, a new family meant edits in five places and a
forgotten one miscounted silently; here it is one :class:`Family` in one module of this
package, and the generic code asks the registry (:mod:`eagle3_pipeline.targets.families`).

Nothing here imports torch or transformers: the plan describes a 1T target from its
``config.json`` in milliseconds.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_pipeline.core.errors import ConfigError

if TYPE_CHECKING:
    from eagle3_pipeline.core.config import TinyModelConfig

# --------------------------------------------------------------------------- aux layers


def vllm_default_aux_layer_ids(num_layers: int) -> list[int]:
    """vLLM's default ``(2, L//2, L-3)`` when it names 3 distinct valid layers, else 3
    layers spread over ``[1, L-1]`` (vLLM's default collapses for small targets)."""
    vllm_default = [2, num_layers // 2, num_layers - 3]
    if (
        all(0 < k < num_layers for k in vllm_default)
        and len(set(vllm_default)) == 3
        and (vllm_default == sorted(vllm_default))
    ):
        return vllm_default
    if num_layers < 2:
        raise ConfigError(f"target has {num_layers} layer(s): EAGLE-3 needs at least 2")
    hi = num_layers - 1
    ids = sorted({round(1 + i * (hi - 1) / 2) for i in range(3)})
    return ids


# --------------------------------------------------------------------------- MoE layouts


def _int(text: dict[str, Any], key: str, default: int) -> int:
    value = text.get(key)
    return default if value is None else int(value)


def first_k_dense_layout(text: dict[str, Any], layer: int) -> bool:
    """DeepSeek-V2/V3: dense below ``first_k_dense_replace``, then every
    ``moe_layer_freq``-th layer is MoE."""
    freq = _int(text, "moe_layer_freq", 1) or 1
    return layer >= _int(text, "first_k_dense_replace", 0) and layer % freq == 0


def sparse_step_layout(text: dict[str, Any], layer: int) -> bool:
    """Qwen2/3-MoE: layer i is MoE when ``(i + 1) % decoder_sparse_step == 0`` and i is
    not in ``mlp_only_layers`` (step 2: layers 1, 3, 5, ...)."""
    step = _int(text, "decoder_sparse_step", 1) or 1
    return layer not in (text.get("mlp_only_layers") or []) and (layer + 1) % step == 0


def interleaved_layout(text: dict[str, Any], layer: int) -> bool:
    """Llama-4: an explicit ``moe_layers`` list, else every
    ``interleave_moe_layer_step``-th layer counted from 1 (step 2: layers 1, 3, ...)."""
    if isinstance(text.get("moe_layers"), list):
        return layer in text["moe_layers"]
    step = _int(text, "interleave_moe_layer_step", 1)
    return step > 0 and (layer + 1) % step == 0


def any_layout(text: dict[str, Any], layer: int) -> bool:
    """An unregistered family: the layout its config keys name."""
    if "decoder_sparse_step" in text or "mlp_only_layers" in text:
        return sparse_step_layout(text, layer)
    if "interleave_moe_layer_step" in text or "moe_layers" in text:
        return interleaved_layout(text, layer)
    return first_k_dense_layout(text, layer)


@dataclass(frozen=True)
class MoeLayout:
    """Which decoder layers are mixture-of-experts and how their experts are sized."""

    expert_count_keys: tuple[str, ...]  # first present wins
    is_moe_layer: Callable[[dict[str, Any], int], bool]
    expert_size_key: str = "moe_intermediate_size"  # else the dense intermediate_size
    router_bias: bool = False  # DeepSeek's per-expert e_score_correction_bias

    def num_experts(self, text: dict[str, Any]) -> int:
        return next((int(text[k]) for k in self.expert_count_keys if text.get(k) is not None), 0)

    def layers(self, text: dict[str, Any], num_layers: int) -> list[int]:
        if not self.num_experts(text):
            return []
        return [i for i in range(num_layers) if self.is_moe_layer(text, i)]

    def expert_size(self, text: dict[str, Any], dense: int) -> int:
        return int(text.get(self.expert_size_key) or dense)


# --------------------------------------------------------------------------- weights


@dataclass(frozen=True)
class WeightNames:
    """Where a checkpoint stores what the pipeline reads, most specific first."""

    decoder_prefixes: tuple[str, ...] = ("model.",)  # embed_tokens / layers / norm under it
    lm_head: tuple[str, ...] = ("lm_head.weight",)
    other_embed: tuple[str, ...] = ()  # names outside the prefix scheme (GPT-2's wte)
    other_norm: tuple[str, ...] = ()

    @property
    def embed(self) -> tuple[str, ...]:
        return tuple(p + "embed_tokens.weight" for p in self.decoder_prefixes) + self.other_embed

    @property
    def norm(self) -> tuple[str, ...]:
        return tuple(p + "norm.weight" for p in self.decoder_prefixes) + self.other_norm

    @property
    def layer_patterns(self) -> tuple[str, ...]:
        return tuple(rf"^{re.escape(p)}layers\.(\d+)\." for p in self.decoder_prefixes if p)


# --------------------------------------------------------------------------- tiny targets


def tiny_common_config(tiny: TinyModelConfig) -> dict[str, Any]:
    """The ``config.json`` keys every tiny target shares (what the tiny builder passes
    to each family's transformers config)."""
    return {
        "hidden_size": tiny.hidden_size,
        "num_hidden_layers": tiny.num_layers,
        "num_attention_heads": tiny.num_heads,
        "intermediate_size": tiny.intermediate_size,
        "vocab_size": tiny.vocab_size,
        "max_position_embeddings": tiny.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    }


def tiny_rope_parameters(tiny: TinyModelConfig) -> dict[str, Any]:
    """transformers 5 spells the real ``rope_scaling: {type: yarn, ...}`` as
    ``rope_parameters: {rope_type: yarn, rope_theta, ...}``."""
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": tiny.rope_theta}
    if tiny.rope_scaling:
        scaling = dict(tiny.rope_scaling)
        params["rope_type"] = scaling.pop("type", scaling.pop("rope_type", "default"))
        params.update(scaling)
    return params


def _unchanged(model_dir: Path) -> None:
    """Most families' checkpoints are what ``save_pretrained`` writes."""


@dataclass(frozen=True)
class TinyBuilder:
    """How the target stage builds a tiny member of the family (selected by
    ``model.tiny.architecture: <family name>``)."""

    # (shape, the shared transformers config kwargs, tokenizer) -> an untrained model
    build: Callable[[TinyModelConfig, dict[str, Any], Any], Any]
    # the config.json it will write, from the shape alone (the plan builds nothing)
    config: Callable[[TinyModelConfig], dict[str, Any]]
    # after save_pretrained: put the checkpoint into the real model's layout
    finalize: Callable[[Path], None] = _unchanged


# --------------------------------------------------------------------------- the family


@dataclass(frozen=True)
class Family:
    """Everything the generic pipeline code must know about one model family."""

    name: str  # the module name, and the value of model.tiny.architecture
    model_types: tuple[str, ...]  # top-level config.json model_type values it matches
    architectures: tuple[str, ...] = ()  # names config.json may carry (any spelling)
    vllm_architecture: str | None = None  # the name vLLM registers; None: as in config
    vllm_eagle3: bool = False  # vLLM exposes EAGLE-3 aux hidden states for it
    text_config_keys: tuple[str, ...] = ()  # where a nested config keeps its text model
    weights: WeightNames = field(default_factory=WeightNames)
    decoder_layers_attrs: tuple[str, ...] = ("layers",)  # on the transformers base model
    final_norm_attrs: tuple[str, ...] = ("norm",)
    moe: MoeLayout | None = None  # None: a dense family
    qk_norm: bool = False  # per-head q/k RMSNorm in attention (Qwen3)
    default_aux_layer_ids: Callable[[int], list[int]] = vllm_default_aux_layer_ids
    end_of_turn: str | None = None  # the token ending an assistant turn
    reasoning_markers: tuple[str, ...] = ()  # open / close of a reasoning block
    auto_class: str = "AutoModelForCausalLM"  # what loads the whole checkpoint
    tiny: TinyBuilder | None = None

    def matches(self, config: dict[str, Any]) -> bool:
        if config.get("model_type") is not None:
            return config["model_type"] in self.model_types
        archs = config.get("architectures") or []
        return bool(archs) and archs[0] in self.architectures

    def vllm_name(self, architecture: str) -> str:
        """vLLM's name for the architecture config.json carries."""
        if self.vllm_architecture and architecture in self.architectures:
            return self.vllm_architecture
        return architecture

    def num_experts(self, text: dict[str, Any]) -> int:
        return self.moe.num_experts(text) if self.moe else 0

    def moe_layers(self, text: dict[str, Any], num_layers: int) -> list[int]:
        return self.moe.layers(text, num_layers) if self.moe else []


# An unregistered family: every spelling seen in transformers checkpoints, in the order
# the adapter has always tried them.
GENERIC = Family(
    name="generic",
    model_types=(),
    text_config_keys=("text_config", "language_config", "llm_config", "thinker_config"),
    weights=WeightNames(
        decoder_prefixes=(
            "language_model.model.",
            "model.language_model.",
            "language_model.",
            "model.",
            "",
        ),
        lm_head=("language_model.lm_head.weight", "lm_head.weight", "model.lm_head.weight"),
        other_embed=("transformer.wte.weight",),
        other_norm=("transformer.ln_f.weight",),
    ),
    decoder_layers_attrs=("layers", "h", "blocks"),
    final_norm_attrs=("norm", "ln_f", "final_layernorm", "final_norm"),
    # router_bias: an unknown router is counted with a per-expert bias, as it always was
    moe=MoeLayout(
        ("n_routed_experts", "num_experts", "num_local_experts"), any_layout, router_bias=True
    ),
)
