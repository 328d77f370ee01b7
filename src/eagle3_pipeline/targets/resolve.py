"""Resolve the configured target to a local directory and describe it in target.json.

A real target is only *read* (config, weight index, tokenizer files): it is never loaded
or copied, so resolving a 1T-parameter checkpoint takes milliseconds. The embedded tiny
target is built (see :mod:`eagle3_pipeline.targets.tiny`), and a GGUF file is converted
into a plain checkpoint (:mod:`eagle3_pipeline.targets.gguf`); both land in
``paths.target``/model, a DVC output.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from eagle3_pipeline.core.errors import ConfigError
from eagle3_pipeline.core.io import atomic_dir, atomic_write_json
from eagle3_pipeline.runtime.precision import Precision, model_precision
from eagle3_pipeline.targets.adapter import TargetSource, TargetSpec, describe_target
from eagle3_pipeline.targets.record import GgufConversion, TargetRecord
from eagle3_pipeline.targets.tiny import TinyTarget
from eagle3_pipeline.targets.view import TargetInputs

log = logging.getLogger(__name__)

TARGET_JSON = "target.json"
MODEL_SUBDIR = "model"

# Files a real target needs for everything before training, none of them weights.
METADATA_PATTERNS = [
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "tokenizer*",
    "*.tiktoken",
    "tiktoken*",
    "chat_template*",
    "special_tokens_map.json",
    "*.py",
]


def locate_real_target(m: TargetSource) -> Path:
    """The directory of a real target: ``model.path``, or the local HF cache snapshot of
    ``model.hub_id`` at ``model.revision`` (never a download at run time)."""
    if m.path:
        p = Path(m.path)
        if not p.is_dir():
            raise ConfigError(f"model.path={m.path}: directory does not exist")
        return p
    if not m.revision:
        raise ConfigError(
            f"model.hub_id={m.hub_id} has no model.revision: pin the commit sha you serve "
            f"(-S model.revision=<sha>) or set model.path to a local checkout"
        )
    try:
        from huggingface_hub import snapshot_download

        assert m.hub_id is not None  # a target without path has a hub id (config check)
        local = snapshot_download(
            m.hub_id, revision=m.revision, allow_patterns=METADATA_PATTERNS, local_files_only=True
        )
    except Exception as exc:  # offline / not cached: say what to do
        raise ConfigError(
            f"model.hub_id={m.hub_id}@{m.revision} is not in the local HF cache and model.path "
            f"is not set ({type(exc).__name__}): download its config and tokenizer files, e.g. "
            f"`hf download {m.hub_id} --revision {m.revision} --include 'config.json' "
            f"'*.json' '*.py' '*.tiktoken'`, or pass model.path=DIR"
        ) from None
    return Path(local)


def check_target(spec: TargetSpec, model_dir: Path) -> None:
    """Refuse targets the pipeline cannot train a draft for, before anything is written."""
    if not spec.chat_template:
        raise ConfigError(
            f"{model_dir}: the tokenizer has no chat template (tokenizer_config.json "
            f"'chat_template' or chat_template.jinja): rows cannot be rendered as the target "
            f"sees them; add the template the target was trained with"
        )
    if spec.hub_id and not spec.revision:
        raise ConfigError(
            f"model.hub_id={spec.hub_id}: set model.revision to the commit sha of {model_dir}"
        )


def _build(
    cfg: TargetInputs, model_dir: Path, progress: bool, dtype: str
) -> TinyTarget | GgufConversion:
    """Write the checkpoint the target stage owns: build the tiny target, or convert the
    GGUF file to ``dtype`` (the precision the later stages load it in); what building it
    measured."""
    if cfg.model.gguf is not None:
        from eagle3_pipeline.targets.gguf import convert_gguf

        model_dir.mkdir(parents=True)
        return convert_gguf(cfg.model.gguf, cfg.model.name, dtype, model_dir)
    from eagle3_pipeline.targets.tiny import build_tiny_target

    assert cfg.model.tiny is not None
    return build_tiny_target(cfg.model.tiny, cfg.target, model_dir, cfg.seed, progress)


def target_precision(cfg: TargetInputs) -> Precision:
    """The precision the checkpoint is written in and the later stages run it in."""
    m = cfg.model
    return model_precision(m.dtype, cfg.hardware.device, m.tiny is not None, cfg.paths.precision)


def target_record(
    spec: TargetSpec, built: TinyTarget | GgufConversion | None, precision: Precision
) -> TargetRecord:
    """The stage's record, field by field: the target's shape facts, the precision the
    later stages run it in and, for a target the stage built (``built``; None: a real
    target, described only), what building it cost."""
    record = TargetRecord(
        built=built is not None,
        precision=precision,
        name=spec.name,
        architecture=spec.architecture,
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        vocab_size=spec.vocab_size,
        aux_layer_ids=list(spec.aux_layer_ids),
        gguf=built if isinstance(built, GgufConversion) else None,
    )
    if not isinstance(built, TinyTarget):
        return record
    return dataclasses.replace(
        record,
        parameters=built.parameters,
        train_tokens=built.train_tokens,
        heldout_tokens=built.heldout_tokens,
        heldout_perplexity=built.heldout_perplexity,
        heldout_perplexity_untrained=built.heldout_perplexity_untrained,
        unigram_perplexity=built.unigram_perplexity,
        perplexity_ratio_vs_unigram=built.perplexity_ratio_vs_unigram,
        reload_logits_identical=built.reload_logits_identical,
        build_wall_s=built.build_wall_s,
        threads=built.threads,
        cpu_count=built.cpu_count,
        final_train_loss=built.training.final_train_loss,
        train_wall_s=built.training.train_wall_s,
        train_steps=built.training.train_steps,
    )


def resolve_target(cfg: TargetInputs, progress: bool = True) -> tuple[TargetSpec, TargetRecord]:
    """Build or locate the target, write ``target.json``; return it with the stage's record."""
    out = Path(cfg.paths.target)
    if cfg.model.built_here:
        if cfg.model.gguf is not None:
            from eagle3_pipeline.targets.gguf import inspect_gguf

            inspect_gguf(cfg.model.gguf, cfg.model.name)  # refused before anything is written
        precision = target_precision(cfg)
        with atomic_dir(out) as tmp:
            model_dir = tmp / MODEL_SUBDIR
            built = _build(cfg, model_dir, progress, precision.dtype)
            final_model_dir = out / MODEL_SUBDIR
            spec = describe_target(model_dir, cfg.model)
            spec.path = str(final_model_dir)
            check_target(spec, model_dir)
            atomic_write_json(tmp / TARGET_JSON, spec.to_dict())
        return spec, target_record(spec, built, precision)
    model_dir = locate_real_target(cfg.model)
    precision = target_precision(cfg)
    spec = describe_target(model_dir, cfg.model)
    check_target(spec, model_dir)
    with atomic_dir(out) as tmp:
        atomic_write_json(tmp / TARGET_JSON, spec.to_dict())
    return spec, target_record(spec, None, precision)
