"""Warm start (``train.init_from``): training begins from an existing draft's weights.

Most users fine-tune a published draft on their own traffic rather than train one from
nothing (speculators' ``--from-pretrained``). The source may be a draft this pipeline
wrote (speculators' format, or the MLA draft's plain DeepSeek config), any speculators
EAGLE-3 checkpoint, or an original EAGLE-3 repository on disk (``LlamaForCausalLMEagle3``
or ``LlamaForCausalLM`` config, ``fc`` and ``midlayer.*`` tensors), which speculators' own
converter turns into its format first. Full-vocabulary sources (draft vocabulary = the
target's; speculators then writes no ``d2t``/``t2d``) are read as well.

Every way a source can differ from the run is refused in one line before any step (and
before any conversion), naming the source's file and key: layer type, widths, aux layers,
the latent sizes of an MLA layer, the layer options and the vocabulary sizes. So is a
directory that is no EAGLE-3 draft (a plain model such as the target itself) and a
config that lacks a key or holds a value of the wrong type.

What is taken from the source: every trainable tensor, and the frozen ``lm_head`` and
``embed_tokens`` the source carries (an original EAGLE-3 draft trains its head, and a
source was trained against its own head and embeddings; for drafts this pipeline wrote
they equal the target's rows). Not taken: ``verifier_lm_head`` / ``verifier_norm``, the
target's own head and norm that produce the training targets (never saved in a draft).
The draft vocabulary *mapping* is taken from the source, not rebuilt from this run's
data: the source's ``lm_head`` rows belong to its ``d2t`` tokens, and a different mapping
of the same size would silently pair rows with the wrong tokens. (speculators' own warm
start overwrites the stored mapping with a new one without re-indexing ``lm_head``.)

The source is a train dependency by content: preflight writes its digest
(:func:`fingerprint`) to ``paths.init_fingerprint``, which train depends on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
from collections.abc import Collection
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config import DraftShapeConfig, eagle3_options
from eagle3_pipeline.core.errors import ConfigError
from eagle3_pipeline.draft import mla_format
from eagle3_pipeline.draft.shape import DraftShape
from eagle3_pipeline.targets.adapter import MlaDims, TargetSpec

log = logging.getLogger(__name__)

KEY = "train.init_from"
# What an original EAGLE-3 repository's config names (SafeAILab's trainer writes either);
# a plain model says the second too, so its tensors decide (an EAGLE-3 draft has ``fc``).
ORIGINAL_ARCHITECTURES = ("LlamaForCausalLMEagle3", "LlamaForCausalLM")
# speculators' converter (its legacy EAGLE-3 model) sizes ``fc`` for this many aux layers.
ORIGINAL_AUX = 3
# Frozen tensors of a draft that a source may carry: taken from it when it does.
FROZEN_FROM_SOURCE = ("lm_head.weight", "embed_tokens.weight")


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
    """``speculators``, ``mla`` (our plain MLA config) or ``eagle3`` (original layout);
    anything else is refused in one line naming the file and the key that says so."""
    config = _read(path)
    where = f"{path / 'config.json'}"
    if "speculators_model_type" in config:
        kind = config["speculators_model_type"]
        if kind != "eagle3":
            raise ConfigError(
                f"{KEY}={path}: {where}'s speculators_model_type is {_show(kind)}: "
                "a speculators draft of another algorithm, not EAGLE-3"
            )
        return "speculators"
    if mla_format.is_served_mla(config):
        return "mla"
    architectures = config.get("architectures")
    names = architectures if isinstance(architectures, list) else []
    if any(a in ORIGINAL_ARCHITECTURES for a in names):
        tensors = weight_shapes(path)
        if "fc.weight" in tensors and any(
            k.startswith(("midlayer.", "layers.0.")) for k in tensors
        ):
            return "eagle3"
        raise ConfigError(
            f"{KEY}={path}: {where}'s architectures is {_show(architectures)} but its weights "
            "hold no fc.weight and no midlayer.* tensors: a plain model (the target itself?), "
            "not an EAGLE-3 draft; name a draft directory"
        )
    raise ConfigError(
        f"{KEY}={path}: {where} has no speculators_model_type and its architectures is "
        f"{_show(architectures)}: neither a speculators EAGLE-3 draft, this pipeline's MLA "
        "draft nor an original EAGLE-3 checkpoint (LlamaForCausalLMEagle3)"
    )


def describe(path: str | Path) -> InitSource:
    """The source at ``path``: refused in one line when absent, of no known format, or
    when its config lacks a key its layout needs."""
    p = Path(path)
    if not (p / "config.json").is_file():
        raise ConfigError(f"{KEY}={path}: no draft there (no config.json); name a draft directory")
    source = InitSource(p, detect_format(p), fingerprint(p))
    source_layout(source)  # a malformed config is refused here (preflight), not mid-train
    return source


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
        raise ConfigError(f"{KEY}={path}: {path}/config.json is unreadable ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{KEY}={path}: {path}/config.json is not a JSON object")
    return data


def weight_shapes(path: Path) -> dict[str, list[int]]:
    """Every tensor name in the directory's weight files with its shape, read from the
    safetensors headers (or a ``pytorch_model.bin``, memory-mapped); {} when it has none."""
    shapes: dict[str, list[int]] = {}
    for f in sorted(path.glob("*.safetensors")):
        shapes.update(_safetensors_shapes(path, f))
    if not shapes and (path / "pytorch_model.bin").is_file():
        import torch

        f = path / "pytorch_model.bin"
        try:
            state = torch.load(f, map_location="cpu", mmap=True, weights_only=True)
        except Exception as exc:  # noqa: BLE001 -- any unreadable pickle is the same refusal
            raise ConfigError(f"{KEY}={path}: {f} is unreadable ({exc})") from None
        shapes = {k: list(v.shape) for k, v in state.items() if hasattr(v, "shape")}
    return shapes


def _safetensors_shapes(source: Path, f: Path) -> dict[str, list[int]]:
    try:
        with f.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        return {k: list(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        raise ConfigError(
            f"{KEY}={source}: {f} has no readable safetensors header ({exc})"
        ) from None


# --------------------------------------------------------------------------- layouts


class _Config:
    """A source's config.json, read key by key: a missing key or a value of the wrong type
    is refused in one line naming the file and the key (never a ``KeyError``)."""

    def __init__(self, source: Path, data: dict[str, Any]) -> None:
        self.source = source
        self.file = source / "config.json"
        self.data = data

    def _get(self, key: str) -> Any:
        node: Any = self.data
        for part in key.split("."):
            if not isinstance(node, dict) or node.get(part) is None:
                return None
            node = node[part]
        return node

    def refuse(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{KEY}={self.source}: {self.file}: {key} {problem}")

    def has(self, key: str) -> bool:
        return self._get(key) is not None

    def integer(self, key: str, default: int | None = None) -> int:
        value = self._get(key)
        if value is None:
            if default is None:
                raise self.refuse(key, "is missing (a malformed draft config)")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.refuse(key, f"is {_show(value)}, not an integer")
        return value

    def opt_int(self, key: str) -> int | None:
        return self.integer(key) if self.has(key) else None

    def flag(self, key: str, default: bool = False) -> bool:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.refuse(key, f"is {_show(value)}, not true or false")
        return value

    def layer_ids(self, key: str) -> list[int] | None:
        value = self._get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise self.refuse(key, f"is {_show(value)}, not a list of layer ids")
        return list(value)

    def text(self, key: str) -> str:
        value = self._get(key)
        if value is None:
            raise self.refuse(key, "is missing (a malformed draft config)")
        if not isinstance(value, str):
            raise self.refuse(key, f"is {_show(value)}, not a string")
        return value


def default_aux_layers(target_layers: int) -> list[int]:
    """The target's default taps when a draft names none: vLLM's and speculators' rule."""
    return [2, target_layers // 2, target_layers - 3]


def source_layout(source: InitSource, target_layers: int | None = None) -> DraftLayout:
    """The layout the source directory declares, in its own format. ``target_layers``:
    the target's layer count, for a source that names no aux layers (vLLM and speculators
    then tap ``default_aux_layers``); without it such a source's aux layers read as []."""
    c = _Config(source.path, _read(source.path))
    if source.format == "mla":
        return _mla_layout(c)
    if source.format == "eagle3":
        return _original_layout(c, target_layers)
    return _speculators_layout(c, target_layers)


def _aux(c: _Config, key: str, target_layers: int | None) -> list[int]:
    aux = c.layer_ids(key)
    if aux:
        return aux
    return default_aux_layers(target_layers) if target_layers else []


def _mla_layout(c: _Config) -> DraftLayout:
    m = MlaDims(
        q_lora_rank=c.opt_int("q_lora_rank"),
        kv_lora_rank=c.integer("kv_lora_rank"),
        qk_nope_head_dim=c.integer("qk_nope_head_dim"),
        qk_rope_head_dim=c.integer("qk_rope_head_dim"),
        v_head_dim=c.integer("v_head_dim"),
    )
    heads = c.integer("num_attention_heads")
    hidden = c.integer("hidden_size")
    return DraftLayout(
        layer_type="mla",
        hidden_size=hidden,
        target_hidden_size=c.integer("target_hidden_size", hidden),
        num_layers=c.integer("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=m.qk_nope_head_dim + m.qk_rope_head_dim,
        intermediate_size=c.integer("intermediate_size"),
        mla=m,
        # our MLA format always writes them; a hand-made one naming none is malformed
        aux_layer_ids=_required_aux(c),
        draft_vocab_size=c.integer("draft_vocab_size"),
        vocab_size=c.integer("vocab_size"),
        norm_before_residual=c.flag("norm_before_residual"),
        norm_before_fc=False,
        fc_norm=c.flag("fc_norm"),
        norm_output=c.flag("norm_output"),
    )


def _required_aux(c: _Config) -> list[int]:
    aux = c.layer_ids("eagle_aux_hidden_state_layer_ids")
    if not aux:
        raise c.refuse("eagle_aux_hidden_state_layer_ids", "is missing (a malformed draft config)")
    return aux


def _speculators_layout(c: _Config, target_layers: int | None) -> DraftLayout:
    t = "transformer_layer_config"
    if not isinstance(c.data.get(t), dict):
        raise c.refuse(t, "is missing (a malformed speculators config)")
    hidden = c.integer(f"{t}.hidden_size")
    heads = c.integer(f"{t}.num_attention_heads")
    return DraftLayout(
        layer_type=c.text(f"{t}.model_type"),
        hidden_size=hidden,
        target_hidden_size=c.integer("target_hidden_size", hidden),
        num_layers=c.integer(f"{t}.num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=c.integer(f"{t}.num_key_value_heads", heads),
        head_dim=c.integer(f"{t}.head_dim", hidden // heads if heads > 0 else 0),
        intermediate_size=c.integer(f"{t}.intermediate_size"),
        mla=None,
        aux_layer_ids=_aux(c, "eagle_aux_hidden_state_layer_ids", target_layers),
        draft_vocab_size=c.integer("draft_vocab_size"),
        vocab_size=c.integer(f"{t}.vocab_size"),
        # speculators' config defaults (Eagle3SpeculatorConfig): what its model builds
        norm_before_residual=c.flag("norm_before_residual"),
        norm_before_fc=c.flag("norm_before_fc"),
        fc_norm=c.flag("fc_norm"),
        norm_output=c.flag("norm_output"),
    )


def _original_aux_key(c: _Config) -> str:
    nested = "eagle_config.eagle_aux_hidden_state_layer_ids"
    return (
        nested
        if not c.has("eagle_aux_hidden_state_layer_ids") and c.has(nested)
        else ("eagle_aux_hidden_state_layer_ids")
    )


def _original_layout(c: _Config, target_layers: int | None) -> DraftLayout:
    """An original EAGLE-3 config read the way speculators' converter reads it, except
    that the keys it would silently default (to Llama-3-8B's sizes) are required here."""
    if not any((c.source / f).is_file() for f in ("model.safetensors", "pytorch_model.bin")):
        raise ConfigError(
            f"{KEY}={c.source}: an original EAGLE-3 draft without model.safetensors or "
            "pytorch_model.bin (speculators' converter reads no sharded checkpoint): "
            "merge its shards into one file"
        )
    tensors = weight_shapes(c.source)
    hidden = c.integer("hidden_size")
    heads = c.integer("num_attention_heads")
    draft_vocab = c.integer("draft_vocab_size")
    target_hidden = c.integer("target_hidden_size", hidden)
    head = tensors.get("lm_head.weight")
    if head is not None and head[0] != draft_vocab:
        raise c.refuse(
            "draft_vocab_size", f"is {draft_vocab} but lm_head.weight has {head[0]} rows"
        )
    fc = tensors.get("fc.weight")
    if fc is not None and len(fc) == 2 and fc[1] != ORIGINAL_AUX * target_hidden:
        raise ConfigError(
            f"{KEY}={c.source}: its fc.weight takes {fc[1]} inputs, not {ORIGINAL_AUX} x "
            f"{target_hidden}: speculators' converter reads original EAGLE-3 drafts with "
            f"{ORIGINAL_AUX} aux layers only"
        )
    aux = _aux(c, _original_aux_key(c), target_layers)
    if aux and len(aux) != ORIGINAL_AUX:
        raise c.refuse(
            _original_aux_key(c),
            f"is {_show(aux)}: speculators' converter reads original EAGLE-3 drafts with "
            f"{ORIGINAL_AUX} aux layers only",
        )
    # no t2d: a full-vocabulary draft, whose head covers the target's vocabulary
    vocab = tensors["t2d"][0] if "t2d" in tensors else draft_vocab
    return DraftLayout(
        layer_type="llama",
        hidden_size=hidden,
        target_hidden_size=target_hidden,
        num_layers=c.integer("num_hidden_layers", 1),
        num_attention_heads=heads,
        num_key_value_heads=c.integer("num_key_value_heads"),
        head_dim=c.integer("head_dim", hidden // heads if heads > 0 else 0),
        intermediate_size=c.integer("intermediate_size"),
        mla=None,
        aux_layer_ids=aux,
        draft_vocab_size=draft_vocab,
        vocab_size=vocab,
        norm_before_residual=c.flag("norm_before_residual"),
        norm_before_fc=c.flag("norm_before_fc"),
        fc_norm=c.flag("fc_norm"),
        norm_output=c.flag("norm_output"),
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

# Where each layout field is read from, per source format (config.json keys; for an MLA
# layout the differing latent size is named on its own).
_T = "transformer_layer_config."
SOURCE_KEYS: dict[str, dict[str, str]] = {
    "speculators": {
        "layer_type": _T + "model_type",
        "hidden_size": _T + "hidden_size",
        "num_layers": _T + "num_hidden_layers",
        "num_attention_heads": _T + "num_attention_heads",
        "num_key_value_heads": _T + "num_key_value_heads",
        "head_dim": _T + "head_dim",
        "intermediate_size": _T + "intermediate_size",
        "vocab_size": _T + "vocab_size",
    },
    "mla": {
        "layer_type": "model_type",
        "num_layers": "num_hidden_layers",
        "num_key_value_heads": "num_attention_heads",
        "head_dim": "qk_nope_head_dim + qk_rope_head_dim",
    },
    "eagle3": {
        "layer_type": "architectures",
        "num_layers": "num_hidden_layers",
        "vocab_size": "t2d (its length; none: draft_vocab_size, a full vocabulary)",
    },
}
_COMMON_KEYS = {
    "aux_layer_ids": "eagle_aux_hidden_state_layer_ids",
    "num_layers": "num_hidden_layers",
}


def source_key(source: InitSource, name: str, theirs: Any, ours: Any) -> str:
    """The config.json key of ``source`` that layout field ``name`` was read from."""
    if name == "mla" and isinstance(theirs, MlaDims) and isinstance(ours, MlaDims):
        return next(
            f.name for f in fields(MlaDims) if getattr(theirs, f.name) != getattr(ours, f.name)
        )
    return SOURCE_KEYS.get(source.format, {}).get(name) or _COMMON_KEYS.get(name, name)


def check_compatible(source: InitSource, theirs: DraftLayout, run: DraftLayout) -> None:
    """Refuse the first field where the source's weights cannot mean what the run's do, in
    one line naming the source's config file and key, and the setting that would match."""
    for f in fields(DraftLayout):
        a, b = getattr(theirs, f.name), getattr(run, f.name)
        if a != b:
            key = source_key(source, f.name, a, b)
            fix = (
                f"{HINTS[f.name]} to match, or start from scratch ({KEY}=null)"
                if f.name in HINTS
                else f"it was trained for another target: start from scratch ({KEY}=null)"
            )
            raise ConfigError(
                f"{KEY}={source.path}: its {f.name} is {_show(a)} ({source.path / 'config.json'}: "
                f"{key}), this run's is {_show(b)}; {fix}"
            )


def _show(value: Any) -> str:
    return json.dumps(asdict(value) if isinstance(value, MlaDims) else value)


# --------------------------------------------------------------------------- loading


def convert_original(source: InitSource, verifier_dir: Path, out: Path, spec: TargetSpec) -> Path:
    """An original EAGLE-3 repository, converted by speculators' converter into ``out``.

    Its config may name no aux layers: EAGLE-3's trainer taps vLLM's default
    (2, L//2, L-3) unless the config says otherwise; they are written so the converted
    draft names them (vLLM would otherwise fall back to the target's default silently)."""
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter

    layout = source_layout(source, spec.num_layers)
    done = out / "source.sha256"
    if done.is_file() and done.read_text().strip() == source.sha256:
        return out
    Eagle3Converter().convert(
        str(source.path),
        str(out),
        str(verifier_dir),
        validate=False,
        norm_before_residual=layout.norm_before_residual,
        norm_before_fc=layout.norm_before_fc,
        fc_norm=layout.fc_norm,
        norm_output=layout.norm_output,
        eagle_aux_hidden_state_layer_ids=layout.aux_layer_ids,
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
    """The source's ``(d2t, t2d)``: its ``lm_head`` rows are those tokens' rows.
    ``(None, None)`` for a full-vocabulary source (its rows are the target's ids; the
    layout check has made the run full-vocabulary too)."""
    d2t, t2d = getattr(source_model, "d2t", None), getattr(source_model, "t2d", None)
    if d2t is None or t2d is None:
        return None, None
    return d2t.clone(), t2d.clone()


def copy_weights(model: Any, source_model: Any, held: Collection[str]) -> int:
    """Every trainable tensor of ``model`` from the source, exactly, and the frozen
    ``lm_head`` / ``embed_tokens`` when the source's files hold them (``held``: the tensor
    names in the directory it was loaded from, :func:`weight_shapes`); returns how many
    tensors were copied. A frozen tensor the files lack is not taken from the loaded
    model: speculators' reload leaves it uninitialised memory rather than the target's
    rows (measured: values near 1e28), so the target's rows ``model`` was built with stay.
    A frozen tensor taken that differs from the target's rows is logged in one line."""
    import torch

    src = source_model.state_dict()
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            frozen = name in FROZEN_FROM_SOURCE
            if frozen and name not in held:
                continue  # the source has none: the target's rows stay
            if not (p.requires_grad or frozen):
                continue
            if name not in src or tuple(src[name].shape) != tuple(p.shape):
                raise ConfigError(
                    f"{KEY}: the source has no tensor {name} of shape {list(p.shape)} "
                    "(its layout passed the checks: the checkpoint is damaged)"
                )
            value = src[name].to(p.dtype)
            if frozen:
                diff = float((value.float() - p.float()).abs().max()) if p.numel() else 0.0
                if diff > 0:
                    log.info(
                        "warm start: %s is the source's, not the target's rows "
                        "(largest difference %.3g)",
                        name,
                        diff,
                    )
            p.copy_(value)
            n += 1
    return n
