"""The registry of target families: one module per family in this package.

Adding a family is one module here that defines ``FAMILY = Family(name=<module name>,
...)`` plus ``conf/model/<name>.yaml``: modules are discovered, not listed, so no other
file changes. A config no family claims is described by :data:`GENERIC` (every spelling
transformers checkpoints use), as before there was a registry.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from typing import Any

from eagle3_pipeline.core.errors import ConfigError
from eagle3_pipeline.targets.families.base import GENERIC, Family

__all__ = [
    "FAMILIES",
    "GENERIC",
    "Family",
    "decoder_layers_attrs",
    "family_for_config",
    "final_norm_attrs",
    "get_family",
    "reasoning_markers",
    "vllm_eagle3_targets",
]

_NOT_FAMILIES = {"base"}

# vLLM 0.33 implements the EAGLE-3 aux-hidden-state interface (SupportsEagle3) for these
# too; they have no family module here (yet), but a target of them is still supported.
_OTHER_VLLM_EAGLE3_TARGETS = (
    "Qwen2ForCausalLM",
    "DeepseekV2ForCausalLM",
    "GptOssForCausalLM",
    "MiniCPMForCausalLM",
    "Llama4ForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen3VLForConditionalGeneration",
)


def _discover() -> dict[str, Family]:
    """Every ``FAMILY`` of the modules in this package, by name (sorted)."""
    found: dict[str, Family] = {}
    claimed: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name in _NOT_FAMILIES:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        family = getattr(module, "FAMILY", None)
        if not isinstance(family, Family) or family.name != info.name:
            raise ImportError(f"{module.__name__}: must define FAMILY = Family(name={info.name!r})")
        for model_type in family.model_types:
            if model_type in claimed:
                raise ImportError(
                    f"model_type {model_type!r} claimed by {claimed[model_type]} and {info.name}"
                )
            claimed[model_type] = info.name
        found[family.name] = family
    return found


FAMILIES: dict[str, Family] = _discover()


def get_family(name: str) -> Family:
    """The family of that name; :class:`ConfigError` naming the known ones otherwise."""
    if name not in FAMILIES:
        raise ConfigError(f"unknown model family {name!r} (known: {', '.join(FAMILIES)})")
    return FAMILIES[name]


def family_for_config(config: dict[str, Any]) -> Family:
    """The family a ``config.json`` belongs to (by ``model_type``, else architecture);
    :data:`GENERIC` when none claims it."""
    return next((f for f in FAMILIES.values() if f.matches(config)), GENERIC)


def _union(groups: Iterable[tuple[str, ...]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(item for group in groups for item in group))


def _all() -> list[Family]:
    return [GENERIC, *FAMILIES.values()]


def reasoning_markers() -> tuple[str, ...]:
    """Every family's reasoning-block markers (looked up in a target's vocabulary)."""
    return _union(f.reasoning_markers for f in FAMILIES.values())


def decoder_layers_attrs() -> tuple[str, ...]:
    return _union(f.decoder_layers_attrs for f in _all())


def final_norm_attrs() -> tuple[str, ...]:
    return _union(f.final_norm_attrs for f in _all())


def vllm_eagle3_targets() -> frozenset[str]:
    """The vLLM architectures a draft can be served against."""
    registered = {f.vllm_architecture for f in FAMILIES.values() if f.vllm_eagle3}
    return frozenset({a for a in registered if a} | set(_OTHER_VLLM_EAGLE3_TARGETS))
