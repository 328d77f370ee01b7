"""The target as the estimates see it: the adapter's description plus its raw config.

Found without building or downloading anything: the tiny target's config comes from its
family's builder and the configured shape, a real one from ``model.path`` or the local
Hugging Face cache, so a 1T-parameter target is described in milliseconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config import ConfigError, ModelConfig
from eagle3_pipeline.targets.adapter import (
    TargetSpec,
    describe_config,
    read_json,
    read_weight_names,
    split_text_config,
)
from eagle3_pipeline.targets.families import Family, family_for_config, get_family


@dataclass
class TargetInfo:
    """The target's adapter description plus its raw config (for weight counting)."""

    spec: TargetSpec
    config: dict[str, Any]
    source: str  # where the config came from

    @property
    def text(self) -> dict[str, Any]:
        return split_text_config(self.config)[1]

    @property
    def family(self) -> Family:
        return family_for_config(self.config)

    @property
    def captured_layer_ids(self) -> list[int]:
        """What extraction captures: the aux layers, then the final state (id = L, the
        stream leaving the last layer, before the final norm)."""
        return [*self.spec.aux_layer_ids, self.spec.num_layers]


def hf_cache_dir(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    home = Path(env["HF_HOME"]) if env.get("HF_HOME") else Path.home() / ".cache" / "huggingface"
    return home / "hub"


def find_in_hf_cache(hub_id: str, revision: str | None, cache: Path) -> Path | None:
    """The snapshot directory of ``hub_id`` (at ``revision``, else what ``refs/main``
    points to) in a local Hugging Face cache, if it holds a config.json."""
    repo = cache / ("models--" + hub_id.replace("/", "--"))
    rev = revision
    if rev is None:
        ref = repo / "refs" / "main"
        rev = ref.read_text(encoding="utf-8").strip() if ref.is_file() else None
    if rev is None:
        return None
    snap = repo / "snapshots" / rev
    return snap if (snap / "config.json").is_file() else None


def load_target(model: ModelConfig, hf_cache: Path | None = None) -> TargetInfo:
    """Describe the configured target without building or downloading anything.

    Order: the tiny target's shape; a GGUF file's metadata; ``model.path``; the local HF cache of ``model.hub_id``.
    Otherwise fail with the one thing to do (pass ``model.path=DIR``).
    """
    if model.tiny is not None:
        builder = get_family(model.tiny.architecture).tiny
        if builder is None:
            raise ConfigError(
                f"model.tiny.architecture={model.tiny.architecture!r} cannot be built"
            )
        config = builder.config(model.tiny)
        return TargetInfo(describe_config(config, model), config, "tiny target shape (model.tiny)")
    if model.gguf is not None:
        gguf = Path(model.gguf.path)
        if not gguf.is_file():
            raise ConfigError(
                f"model.gguf.path={model.gguf.path}: file not found (run "
                f"`eagle3-fetch {model.name}`, or put the file there)"
            )
        from eagle3_pipeline.compat.transformers_gguf import config_from_metadata

        config = config_from_metadata(gguf)
        # the metadata names no class: the family's (what config.json says once converted)
        config.setdefault("architectures", list(family_for_config(config).architectures[:1]))
        return TargetInfo(describe_config(config, model), config, f"GGUF metadata of {gguf}")
    if model.path:
        model_dir = Path(model.path)
        source = f"model.path={model.path}"
    else:
        found = (
            find_in_hf_cache(model.hub_id, model.revision, hf_cache or hf_cache_dir())
            if model.hub_id
            else None
        )
        if found is None:
            raise ConfigError(
                f"model {model.name}: no config.json to read: model.path is null and "
                f"{model.hub_id} is not in the local Hugging Face cache; pass model.path=DIR "
                f"(a directory holding at least config.json)"
            )
        model_dir = found
        source = f"HF cache {found}"
    config = read_json(model_dir / "config.json", "config.json (pass model.path=DIR)")
    spec = describe_config(config, model, read_weight_names(model_dir))
    return TargetInfo(spec, config, source)
