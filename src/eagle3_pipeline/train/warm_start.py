"""Warm start (``train.init_from``): training begins from an existing draft's weights.

Most users fine-tune a published draft on their own traffic rather than train one from
nothing (speculators' ``--from-pretrained``). The source may be a draft this pipeline
wrote (speculators' format, or the MLA draft's plain DeepSeek config), any speculators
EAGLE-3 checkpoint, or an original EAGLE-3 repository on disk (``LlamaForCausalLMEagle3``,
``midlayer.*`` tensors), which speculators' own converter turns into its format first.

Every way a source can differ from the run is refused in one line before any step:
layer type, widths, aux layers, the layer options and the vocabulary sizes. The draft
vocabulary *mapping* is taken from the source, not rebuilt from this run's data: the
source's ``lm_head`` rows belong to its ``d2t`` tokens, and a different mapping of the
same size would silently pair rows with the wrong tokens. (speculators' own warm start
overwrites the stored mapping with a new one without re-indexing ``lm_head``.)

The source is a train dependency by content: preflight writes its digest
(:func:`fingerprint`) to ``paths.init_fingerprint``, which train depends on.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config import DraftShapeConfig, eagle3_options
from eagle3_pipeline.core.errors import ConfigError
from eagle3_pipeline.draft import mla_format
from eagle3_pipeline.draft.shape import DraftShape
from eagle3_pipeline.targets.adapter import MlaDims, TargetSpec

KEY = "train.init_from"
# What an original EAGLE-3 repository's config names (SafeAILab's trainer writes these).
ORIGINAL_ARCHITECTURES = ("LlamaForCausalLMEagle3", "LlamaForCausalLM")


@dataclass(frozen=True)
class DraftLayout:
    """What a draft's weights mean, compared field by field between source and run."""

    layer_type: str
    hidden_size: int
    target_hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    mla: MlaDims | None
    aux_layer_ids: list[int]
    draft_vocab_size: int
    vocab_size: int
    norm_before_residual: bool
    norm_before_fc: bool
    fc_norm: bool
    norm_output: bool


@dataclass(frozen=True)
class InitSource:
    """A warm-start source: where, in which format, its layout and content digest."""

    path: Path
    format: str  # "speculators" | "mla" | "eagle3"
    sha256: str


def detect_format(path: Path) -> str:
    """``speculators``, ``mla`` (our plain MLA config) or ``eagle3`` (original layout)."""
    config = _read(path)
    if "speculators_model_type" in config:
        if config["speculators_model_type"] != "eagle3":
            raise ConfigError(
                f"{KEY}={path}: a speculators {config['speculators_model_type']} draft, not EAGLE-3"
            )
        return "speculators"
    if mla_format.is_served_mla(config):
        return "mla"
    if any(a in ORIGINAL_ARCHITECTURES for a in config.get("architectures") or []):
        return "eagle3"
    raise ConfigError(
        f"{KEY}={path}/config.json: neither a speculators EAGLE-3 draft, this pipeline's MLA "
        "draft nor an original EAGLE-3 checkpoint (LlamaForCausalLMEagle3)"
    )


def describe(path: str | Path) -> InitSource:
    """The source at ``path`` (refused in one line when absent or of no known format)."""
    p = Path(path)
    if not (p / "config.json").is_file():
        raise ConfigError(f"{KEY}={path}: no draft there (no config.json); name a draft directory")
    return InitSource(p, detect_format(p), fingerprint(p))


def fingerprint(path: Path) -> str:
    """SHA-256 over the directory's config and weight files (names and bytes)."""
    digest = hashlib.sha256()
    for f in sorted(path.iterdir()):
        if f.is_file() and (f.suffix in (".json", ".safetensors", ".bin", ".pt")):
            digest.update(f.name.encode() + b"\0")
            with f.open("rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{KEY}={path}/config.json: unreadable ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{KEY}={path}/config.json: not a JSON object")
    return data


# --------------------------------------------------------------------------- layouts


def source_layout(path: Path) -> DraftLayout:
    """The layout a speculators or MLA draft directory declares."""
    c = _read(path)
    if mla_format.is_served_mla(c):
        q_lora = c.get("q_lora_rank")
        m = MlaDims(
            q_lora_rank=int(q_lora) if q_lora is not None else None,
            kv_lora_rank=int(c["kv_lora_rank"]),
            qk_nope_head_dim=int(c["qk_nope_head_dim"]),
            qk_rope_head_dim=int(c["qk_rope_head_dim"]),
            v_head_dim=int(c["v_head_dim"]),
        )
        heads = int(c["num_attention_heads"])
        return DraftLayout(
            layer_type="mla",
            hidden_size=int(c["hidden_size"]),
            target_hidden_size=int(c.get("target_hidden_size") or c["hidden_size"]),
            num_layers=int(c["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=heads,
            head_dim=m.qk_nope_head_dim + m.qk_rope_head_dim,
            intermediate_size=int(c["intermediate_size"]),
            mla=m,
            aux_layer_ids=[int(a) for a in c["eagle_aux_hidden_state_layer_ids"]],
            draft_vocab_size=int(c["draft_vocab_size"]),
            vocab_size=int(c["vocab_size"]),
            norm_before_residual=bool(c.get("norm_before_residual", False)),
            norm_before_fc=False,
            fc_norm=bool(c.get("fc_norm", False)),
            norm_output=bool(c.get("norm_output", False)),
        )
    t = c.get("transformer_layer_config") or {}
    heads = int(t["num_attention_heads"])
    return DraftLayout(
        layer_type=str(t.get("model_type")),
        hidden_size=int(t["hidden_size"]),
        target_hidden_size=int(c.get("target_hidden_size") or t["hidden_size"]),
        num_layers=int(t["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=int(t.get("num_key_value_heads") or heads),
        head_dim=int(t.get("head_dim") or int(t["hidden_size"]) // heads),
        intermediate_size=int(t["intermediate_size"]),
        mla=None,
        aux_layer_ids=[int(a) for a in c.get("eagle_aux_hidden_state_layer_ids") or []],
        draft_vocab_size=int(c["draft_vocab_size"]),
        vocab_size=int(t["vocab_size"]),
        norm_before_residual=bool(c.get("norm_before_residual", False)),
        norm_before_fc=bool(c.get("norm_before_fc", False)),
        fc_norm=bool(c.get("fc_norm", False)),
        norm_output=bool(c.get("norm_output", False)),
    )


def run_layout(
    shape: DraftShape, spec: TargetSpec, draft_vocab_size: int, options: DraftShapeConfig
) -> DraftLayout:
    """The layout this run would build (``options``: ``train.draft``)."""
    return DraftLayout(
        layer_type=str(shape.layer_type),
        hidden_size=shape.hidden_size,
        target_hidden_size=spec.hidden_size,
        num_layers=shape.num_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        intermediate_size=shape.intermediate_size,
        mla=shape.mla,
        aux_layer_ids=list(spec.aux_layer_ids),
        draft_vocab_size=draft_vocab_size,
        vocab_size=spec.vocab_size,
        norm_before_residual=bool(options.norm_before_residual),
        **eagle3_options(options),
    )


# How to make the run match the source, where one setting does.
HINTS = {
    "layer_type": "set train.draft.layer_type",
    "num_layers": "set train.draft.num_layers",
    "num_attention_heads": "set train.draft.num_attention_heads",
    "num_key_value_heads": "set train.draft.num_key_value_heads",
    "head_dim": "set train.draft.head_dim",
    "intermediate_size": "set train.draft.intermediate_size",
    "draft_vocab_size": "set train.draft_vocab_size",
    "aux_layer_ids": "set model.aux_layer_ids (the hidden states are re-extracted)",
    "norm_before_residual": "set train.draft.norm_before_residual",
    "norm_before_fc": "set train.draft.norm_before_fc",
    "fc_norm": "set train.draft.fc_norm",
    "norm_output": "set train.draft.norm_output",
}


def check_compatible(path: Path, source: DraftLayout, run: DraftLayout) -> None:
    """Refuse the first field where the source's weights cannot mean what the run's do."""
    for f in fields(DraftLayout):
        theirs, ours = getattr(source, f.name), getattr(run, f.name)
        if theirs != ours:
            hint = HINTS.get(f.name, "it was trained for another target")
            raise ConfigError(
                f"{KEY}={path}: its {f.name} is {_show(theirs)}, this run's is {_show(ours)}; "
                f"{hint} to match, or start from scratch (train.init_from=null)"
            )


def _show(value: Any) -> str:
    return json.dumps(asdict(value) if isinstance(value, MlaDims) else value)


# --------------------------------------------------------------------------- loading


def convert_original(source: InitSource, verifier_dir: Path, out: Path, spec: TargetSpec) -> Path:
    """An original EAGLE-3 repository, converted by speculators' converter into ``out``.

    Its config names no aux layers: EAGLE-3's trainer taps vLLM's default (2, L//2, L-3)
    unless the config says otherwise; they are written so the layout check compares them."""
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter

    config = _read(source.path)
    aux = config.get("eagle_aux_hidden_state_layer_ids") or (
        (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    )
    n = spec.num_layers
    aux = list(aux) if aux else [2, n // 2, n - 3]
    done = out / "source.sha256"
    if done.is_file() and done.read_text().strip() == source.sha256:
        return out
    Eagle3Converter().convert(
        str(source.path),
        str(out),
        str(verifier_dir),
        validate=False,
        norm_before_residual=bool(config.get("norm_before_residual", False)),
        eagle_aux_hidden_state_layer_ids=aux,
    )
    done.write_text(source.sha256 + "\n")
    return out


def speculators_dir(source: InitSource, verifier_dir: Path, work: Path, spec: TargetSpec) -> Path:
    """A directory our reload reads: the source itself, or its conversion under ``work``."""
    if source.format != "eagle3":
        return source.path
    return convert_original(source, verifier_dir, work / "init_converted", spec)


def load_source(path: Path, verifier_dir: Path) -> Any:
    """The source draft as an ``Eagle3DraftModel`` (the project's one reload path)."""
    from eagle3_pipeline.draft.checkpoint import load_trained_draft

    return load_trained_draft(path, verifier_dir)


def vocab(source_model: Any) -> tuple[Any, Any]:
    """The source's ``(d2t, t2d)``: its ``lm_head`` rows are those tokens' rows."""
    d2t, t2d = getattr(source_model, "d2t", None), getattr(source_model, "t2d", None)
    if d2t is None or t2d is None:
        raise ConfigError(
            f"{KEY}: the source has no vocabulary mapping (d2t/t2d): a full-vocabulary "
            "draft; train it with train.draft_vocab_size = the target's vocabulary"
        )
    return d2t.clone(), t2d.clone()


def copy_weights(model: Any, source_model: Any) -> int:
    """Every trainable tensor of ``model`` from the source, exactly; returns how many."""
    import torch

    src = source_model.state_dict()
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            if name not in src or tuple(src[name].shape) != tuple(p.shape):
                raise ConfigError(
                    f"{KEY}: the source has no tensor {name} of shape {list(p.shape)} "
                    "(its layout passed the checks: the checkpoint is damaged)"
                )
            p.copy_(src[name].to(p.dtype))
            n += 1
    return n
