"""The rules across keys, and the ranges the types cannot express: run on every composed
config (a stage's, ``eagle3-compose``'s, and DVC's ``exp run -S`` through the hook), so a
bad combination is refused before any stage starts."""

from __future__ import annotations

import json
import os
from dataclasses import fields, is_dataclass
from typing import Any

from eagle3_pipeline.core.choices import (
    DraftLayerType,
    TinyArchitecture,
)
from eagle3_pipeline.core.config.schema import Config, ModelConfig, ValidateConfig
from eagle3_pipeline.core.errors import ConfigError


def _check_bounds(node: Any, prefix: str = "") -> None:
    """Every :func:`setting` field under ``node`` within its declared bounds."""
    for f in fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if is_dataclass(value):
            _check_bounds(value, f"{key}.")
        bounds = f.metadata.get("bounds")
        if bounds is None or value is None:
            continue
        ge, gt, le, lt = bounds
        for bad, words in (
            (ge is not None and value < ge, f">= {ge}"),
            (gt is not None and value <= gt, f"> {gt}"),
            (le is not None and value > le, f"<= {le}"),
            (lt is not None and value >= lt, f"< {lt}"),
        ):
            if bad:
                null = " (or null)" if "None" in str(f.type) else ""  # a nullable field
                raise ConfigError(f"{key}={value} must be {words}{null}")


def _check_loss(spec: str) -> None:
    """``train.loss``: one of speculators' loss names, or a JSON dict of them to weights."""
    from eagle3_pipeline.core.choices import LossName

    names = [n.value for n in LossName]
    if spec in names:
        return
    try:
        parsed = json.loads(spec)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict) or not parsed:
        raise ConfigError(
            f"train.loss={spec!r}: use one of {', '.join(names)}, or a JSON dict "
            'of them to weights, e.g. {"ce": 0.1, "tv": 0.9}'
        )
    for name, weight in parsed.items():
        if name not in names or isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ConfigError(
                f"train.loss: {name!r}: {weight!r} is not a loss name of "
                f"{', '.join(names)} with a numeric weight"
            )


def _check_runtime(cfg: Config) -> None:
    """Rules across the train and hardware settings (device, kernels, process counts)."""
    t, hw = cfg.train, cfg.hardware
    device = t.device or hw.device
    if device == "cpu" and t.attn_implementation == "simple_flex_attention":
        raise ConfigError(
            "train.attn_implementation=simple_flex_attention has no CPU backward "
            "(use sdpa_packed or sdpa on CPU)"
        )
    if device == "cuda" and t.nproc is not None and hw.gpu_count and t.nproc > hw.gpu_count:
        raise ConfigError(
            f"train.nproc={t.nproc} exceeds hardware.gpu_count={hw.gpu_count} (one worker per GPU)"
        )
    if cfg.extract.mode == "online" and cfg.extract.world_size != 1:
        raise ConfigError(
            f"extract.world_size={cfg.extract.world_size}: online mode has no extraction to "
            "split (the train stage's server serves every rank); set extract.world_size=1"
        )
    if cfg.extract.rank >= cfg.extract.world_size:
        raise ConfigError(
            f"extract.rank={cfg.extract.rank} must be < extract.world_size={cfg.extract.world_size}"
        )


def check_tiny_architecture(name: str) -> None:
    """``model.tiny.architecture`` must name a family that has a tiny builder (a
    :class:`TinyArchitecture`; also checked here for a config built in Python)."""
    buildable = [a.value for a in TinyArchitecture]
    if name not in buildable:
        raise ConfigError(f"model.tiny.architecture={name!r} is not one of {', '.join(buildable)}")


def _check_model(m: ModelConfig) -> None:
    sources = [
        k
        for k, v in (("model.tiny", m.tiny), ("model.gguf", m.gguf), ("model.path", m.path))
        if v is not None
    ]
    if not sources and not m.hub_id:
        raise ConfigError(
            "model: set model.tiny (build locally), model.gguf, model.path or model.hub_id"
        )
    if m.hub_id and m.tiny is not None:
        sources.append("model.hub_id")  # a built target has no hub id
    if len(sources) > 1:
        raise ConfigError(
            f"model: {' and '.join(sources)} are both set: a target has one "
            "source (set the others to null)"
        )
    if m.gguf is not None:
        if not m.gguf.path:
            raise ConfigError("model.gguf.path is empty: name the GGUF file")
        if m.gguf.package and not (m.gguf.version and m.gguf.member):
            raise ConfigError(
                "model.gguf.package is set: also pin model.gguf.version and name "
                "model.gguf.member (the file's path inside the wheel)"
            )
    if m.tiny is not None:
        check_tiny_architecture(m.tiny.architecture)
    if m.aux_layer_ids is not None and len(m.aux_layer_ids) == 0:
        raise ConfigError("model.aux_layer_ids is empty: use null for the adapter's default")


def validate(cfg: Config) -> Config:
    """Checks across keys, and ranges the types cannot express (the choice fields are
    Enums: OmegaConf refused a bad one already); raise :class:`ConfigError`."""
    _check_model(cfg.model)
    hw = cfg.hardware
    if hw.device == "cuda" and hw.gpu_count < 1:
        raise ConfigError("hardware.gpu_count must be >= 1 when hardware.device is cuda")
    if hw.device == "cpu" and hw.gpu_count != 0:
        raise ConfigError("hardware.gpu_count must be 0 when hardware.device is cpu")
    _check_bounds(cfg)
    _check_loss(cfg.train.loss)
    _check_runtime(cfg)
    bad_k = [k for k in cfg.validate.k_sweep or [] if not 1 <= k <= cfg.train.speculative_tokens]
    if bad_k:
        raise ConfigError(
            f"validate.k_sweep={cfg.validate.k_sweep}: {bad_k} outside 1.."
            f"{cfg.train.speculative_tokens} (train.speculative_tokens: the draft "
            "is trained for that many steps)"
        )
    _check_serving_sweeps(cfg.validate)
    d = cfg.train.draft
    if d.norm_before_fc and d.fc_norm:
        raise ConfigError(
            "train.draft.norm_before_fc and train.draft.fc_norm are exclusive "
            "(one RMSNorm over the concatenated aux states, or one per state)"
        )
    if d.norm_before_fc and d.layer_type == DraftLayerType.mla:
        raise ConfigError(
            "train.draft.norm_before_fc=true: vLLM's MLA draft (deepseek_eagle3) has no "
            "norm before fc and would drop it at serve time; leave it null (or use fc_norm)"
        )
    if cfg.data.source in ("file", "hf") and not cfg.data.path:
        raise ConfigError(f"data.path is required when data.source={cfg.data.source}")
    _check_init_from(cfg)
    _check_prompt_sets(cfg)
    return cfg


def _check_init_from(cfg: Config) -> None:
    """A warm start from train's own output: DVC deletes ``data/draft`` before train runs,
    and each run would change the source it depends on (train would never be up to date),
    so the user copies the draft out first."""
    init = cfg.train.init_from
    if init is None:
        return
    src = os.path.normpath(os.path.abspath(init))
    for key in ("draft", "train_state"):
        out = os.path.normpath(os.path.abspath(getattr(cfg.paths, key)))
        if src == out or src.startswith(out + os.sep):
            raise ConfigError(
                f"train.init_from={init} is train's own output (paths.{key}): DVC deletes it "
                "before train runs and every run would change it; copy it out first, e.g. "
                f"cp -r {getattr(cfg.paths, key)} drafts/base && dvc exp run -S "
                "train.init_from=drafts/base"
            )


def _check_serving_sweeps(v: ValidateConfig) -> None:
    """The K sweep and concurrency levels vLLM is asked to serve (the temperature's range
    is declared on its field: vLLM refuses a negative one and silently raises one under
    0.01 to 0.01, which would mislabel the figure)."""
    if v.k_sweep is not None:
        if not v.k_sweep:
            raise ConfigError("validate.k_sweep is empty: list K values (e.g. [1,2,3]) or null")
        if len(set(v.k_sweep)) != len(v.k_sweep):
            raise ConfigError(f"validate.k_sweep={v.k_sweep}: a K is named twice")
    if not v.concurrency:
        raise ConfigError("validate.concurrency is empty: list request counts (e.g. [1,4,16])")
    bad = [c for c in v.concurrency if c < 1]
    if bad:
        raise ConfigError(
            f"validate.concurrency={v.concurrency}: {bad} below 1 (requests in flight)"
        )
    if len(set(v.concurrency)) != len(v.concurrency):
        raise ConfigError(f"validate.concurrency={v.concurrency}: a level is named twice")


def _check_prompt_sets(cfg: Config) -> None:
    """``validate.prompt_sets`` (the names themselves are a Choice) and a subset no larger
    than any set it is taken from."""
    from eagle3_pipeline.core.choices import PROMPT_SET_SIZES

    v = cfg.validate
    if not v.prompt_sets:
        raise ConfigError("validate.prompt_sets is empty: name at least one (e.g. [heldout])")
    names = [str(getattr(s, "value", s)) for s in v.prompt_sets]
    if len(set(names)) != len(names):
        raise ConfigError(f"validate.prompt_sets={names}: a set is named twice")
    if v.num_prompts is None:
        return
    sizes = {**PROMPT_SET_SIZES, "heldout": cfg.data.heldout_size}
    for name in names:
        if v.num_prompts > sizes[name]:
            key = " (data.heldout_size)" if name == "heldout" else ""
            raise ConfigError(
                f"validate.num_prompts={v.num_prompts} exceeds prompt set {name} "
                f"({sizes[name]} prompts{key}): lower it, or null for the whole set"
            )
