"""The target adapter: every model-family quirk of a target, resolved in one place.

Real targets differ in ways that break naive code silently: Kimi-K2.5 nests its
DeepSeek-V3 text model under ``text_config`` and stores weights under
``language_model.``; transformers and vLLM register different architecture names for it;
MLA attention has no plain ``head_dim``; vLLM's default aux layers ``(2, L//2, L-3)`` are
invalid for small models. Each quirk is a field of the target's family
(:mod:`eagle3_pipeline.targets.families`), not an ``if kimi`` branch here, so a new
family is a new module there, not a new code path; a config no family claims is read
with every spelling transformers checkpoints use.

This module reads only JSON (config, weight index, safetensors headers, tokenizer
config): it never loads weights, so it works on a config-only replica of a 1T target.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from eagle3_pipeline.core.errors import ConfigError
from eagle3_pipeline.core.safetensors import read_header
from eagle3_pipeline.targets.families import (
    GENERIC,
    Family,
    family_for_config,
    vllm_eagle3_targets,
)

# Target architectures whose vLLM implementation exposes the EAGLE-3 aux-hidden-state
# interface (vLLM 0.33, read from its model registry / SupportsEagle3 implementers).
VLLM_EAGLE3_TARGETS = vllm_eagle3_targets()


@dataclass(frozen=True)
class MlaDims:
    """An MLA target's latent attention sizes (config.json's names): what an MLA draft
    layer copies, and what vLLM's MLA kernels are chosen by (the CPU one wants
    kv_lora_rank + qk_rope_head_dim = 576)."""

    q_lora_rank: int | None  # the query's low rank (None: one full query projection)
    kv_lora_rank: int  # the joint key/value latent's width
    qk_nope_head_dim: int  # per head: the query/key part without rotary embedding
    qk_rope_head_dim: int  # per head: the query/key part with rotary embedding
    v_head_dim: int  # per head: the value's width


@dataclass
class TargetSpec:
    """The stable description of a target written to ``target.json``."""

    name: str
    model_type: str
    architecture: str
    vllm_architecture: str
    vllm_eagle3_supported: bool
    nested: bool
    text_config_key: str | None
    text_model_type: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    attention: str  # "mla" or "standard"
    moe: bool
    num_experts: int
    aux_layer_ids: list[int]
    aux_layer_ids_source: str  # "config" or "adapter default"
    weights: dict[str, str | None] = field(default_factory=dict)
    tie_word_embeddings: bool = False
    weight_prefix: str = ""
    chat_template: bool = False
    quantization: str | None = None
    torch_dtype: str | None = None
    max_position_embeddings: int | None = None
    rope_type: str = "default"  # default | yarn | ...: picks vLLM's rotary implementation
    rms_norm_eps: float = 1e-6
    mla: MlaDims | None = None  # the latent sizes when attention == "mla"
    hub_id: str | None = None
    revision: str | None = None
    trust_remote_code: bool = False
    path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TargetSpec:
        mla = data.get("mla")
        return cls(**{**data, "mla": MlaDims(**mla) if isinstance(mla, dict) else None})

    @property
    def verifier_id(self) -> str:
        """What a draft's ``verifier.name_or_path`` should carry for this target."""
        return self.hub_id or str(self.path)


# --------------------------------------------------------------------------- configs


def read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: {what} not found")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {what} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: {what} must be a JSON object")
    return data


def split_text_config(config: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """Return (key, text config) for nested configs, (None, config) for flat ones."""
    for key in family_for_config(config).text_config_keys:
        sub = config.get(key)
        if isinstance(sub, dict) and ("hidden_size" in sub or "num_hidden_layers" in sub):
            return key, sub
    return None, config


def _first(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def resolve_aux_layer_ids(
    num_layers: int, requested: list[int] | None, family: Family = GENERIC
) -> tuple[list[int], str]:
    """Validate the configured aux ids (id k = residual stream entering layer k); none
    configured: the family's default."""
    if requested is None:
        return family.default_aux_layer_ids(num_layers), "adapter default"
    ids = [int(k) for k in requested]
    bad = [k for k in ids if not 0 <= k < num_layers]
    if bad:
        raise ConfigError(
            f"model.aux_layer_ids={ids}: {bad} out of range for a {num_layers}-layer target "
            f"(valid: 0..{num_layers - 1}; id k is the residual stream entering layer k)"
        )
    if len(set(ids)) != len(ids):
        raise ConfigError(f"model.aux_layer_ids={ids}: ids must be distinct")
    return ids, "config"


# --------------------------------------------------------------------------- weights


def read_weight_names(model_dir: Path) -> list[str]:
    """Tensor names from the weight index, or from the headers of single files."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        data = read_json(index, "weight index")
        return sorted(data.get("weight_map", {}))
    files = sorted(model_dir.glob("*.safetensors"))
    names: list[str] = []
    for f in files:
        names.extend(read_header(f))
    return sorted(names)


def _candidates(family: Family, kind: str) -> tuple[str, ...]:
    """The family's names for ``kind`` first, then every generic spelling."""
    return tuple(dict.fromkeys((*getattr(family.weights, kind), *getattr(GENERIC.weights, kind))))


def resolve_weight_names(
    names: Iterable[str], tied: bool, family: Family = GENERIC
) -> dict[str, str | None]:
    """Pick embed_tokens / lm_head / final norm names by ordered candidates."""
    present = set(names)
    embed_c, head_c, norm_c = (_candidates(family, k) for k in ("embed", "lm_head", "norm"))

    def pick(cands: tuple[str, ...]) -> str | None:
        return next((c for c in cands if c in present), None)

    embed, lm_head, norm = pick(embed_c), pick(head_c), pick(norm_c)
    if present:
        if embed is None:
            raise ConfigError(f"no embedding weight found (tried {', '.join(embed_c)})")
        if norm is None:
            raise ConfigError(f"no final norm weight found (tried {', '.join(norm_c)})")
        if lm_head is None and not tied:
            raise ConfigError(
                f"no lm_head weight found and embeddings are not tied (tried {', '.join(head_c)})"
            )
    return {"embed_tokens": embed, "lm_head": None if tied else lm_head, "final_norm": norm}


def weight_prefix(names: Iterable[str], family: Family = GENERIC) -> str:
    """The prefix under which the language model's decoder layers are stored."""
    patterns = _candidates(family, "layer_patterns")
    for name in names:
        for pat in patterns:
            m = re.match(pat, name)
            if m:
                return name[: m.start(1)].removesuffix("layers.")
    return ""


# --------------------------------------------------------------------------- describe


def _revision_from_path(path: Path) -> str | None:
    """An HF cache snapshot directory is named by its commit sha."""
    if path.parent.name == "snapshots" and re.fullmatch(r"[0-9a-f]{40}", path.name):
        return path.name
    return None


def has_chat_template(model_dir: Path) -> bool:
    if (model_dir / "chat_template.jinja").is_file() or (
        model_dir / "chat_template.json"
    ).is_file():
        return True
    tok_cfg = model_dir / "tokenizer_config.json"
    if tok_cfg.is_file():
        return bool(read_json(tok_cfg, "tokenizer config").get("chat_template"))
    return False


def rope_type(text: dict[str, Any]) -> str:
    """The rope scaling kind, in either spelling (``rope_scaling.type`` in real checkpoints,
    ``rope_parameters.rope_type`` as transformers 5 writes it)."""
    for key, field_ in (
        ("rope_scaling", "type"),
        ("rope_scaling", "rope_type"),
        ("rope_parameters", "rope_type"),
    ):
        block = text.get(key)
        if isinstance(block, dict) and block.get(field_):
            return str(block[field_])
    return "default"


def _size(config: dict[str, Any], key: str | None, text: dict[str, Any]) -> tuple[int, int, int]:
    """(layers, hidden size, vocabulary) in any of the spellings checkpoints use."""
    num_layers = _first(text, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _first(text, "hidden_size", "n_embd", "d_model")
    vocab = _first(text, "vocab_size", default=config.get("vocab_size"))
    if not isinstance(num_layers, int) or not isinstance(hidden, int) or not isinstance(vocab, int):
        where = f"{key}." if key else ""
        raise ConfigError(
            f"config.json: cannot read {where}num_hidden_layers / hidden_size / vocab_size"
        )
    return num_layers, hidden, vocab


def _attention(text: dict[str, Any], hidden: int) -> dict[str, Any]:
    """Head counts and head_dim; MLA has no single head_dim (q/k use nope + rope dims,
    v uses v_head_dim), so its head_dim is the q/k one."""
    heads = int(_first(text, "num_attention_heads", "n_head", default=1))
    mla = text.get("kv_lora_rank") is not None
    if mla:
        head_dim = int(text.get("qk_nope_head_dim", 0)) + int(text.get("qk_rope_head_dim", 0))
    else:
        head_dim = int(_first(text, "head_dim", default=hidden // heads))
    return {
        "num_attention_heads": heads,
        "num_key_value_heads": int(_first(text, "num_key_value_heads", default=heads)),
        "head_dim": head_dim,
        "attention": "mla" if mla else "standard",
    }


def _mla_dims(text: dict[str, Any]) -> MlaDims | None:
    if text.get("kv_lora_rank") is None:
        return None
    q_lora = text.get("q_lora_rank")
    nope = int(text.get("qk_nope_head_dim", 0))
    return MlaDims(
        q_lora_rank=int(q_lora) if q_lora is not None else None,
        kv_lora_rank=int(text["kv_lora_rank"]),
        qk_nope_head_dim=nope,
        qk_rope_head_dim=int(text.get("qk_rope_head_dim", 0)),
        v_head_dim=int(text.get("v_head_dim", nope)),
    )


def _tied(config: dict[str, Any], key: str | None, text: dict[str, Any]) -> bool:
    """Tied embeddings; a top-level value (Kimi's False) overrides a nested default."""
    if "tie_word_embeddings" in config and key is not None:
        return bool(config["tie_word_embeddings"])
    return bool(
        _first(text, "tie_word_embeddings", default=config.get("tie_word_embeddings", False))
    )


class TargetSource(Protocol):
    """What describing a target reads of its configuration (``model.*``): its name, where
    its files come from, and the aux layer ids asked for. The target stage's view, the
    whole ``model`` section and a tool's ad-hoc ``ModelConfig`` all satisfy it."""

    @property
    def name(self) -> str: ...
    @property
    def path(self) -> str | None: ...
    @property
    def hub_id(self) -> str | None: ...
    @property
    def revision(self) -> str | None: ...
    @property
    def trust_remote_code(self) -> bool: ...
    @property
    def aux_layer_ids(self) -> list[int] | None: ...


def _provenance(model: TargetSource) -> dict[str, Any]:
    """Where the target comes from: hub id, revision (or the HF cache snapshot's sha)."""
    path = Path(model.path) if model.path else None
    revision = model.revision or (_revision_from_path(path.resolve()) if path else None)
    return {
        "hub_id": model.hub_id,
        "revision": revision,
        "trust_remote_code": model.trust_remote_code,
        "path": str(path) if path else None,
    }


def describe_config(
    config: dict[str, Any], model: TargetSource, weight_names: list[str] | None = None
) -> TargetSpec:
    """Describe a target from its ``config.json`` (and weight names when known)."""
    family = family_for_config(config)
    key, text = split_text_config(config)
    arch = (config.get("architectures") or text.get("architectures") or ["unknown"])[0]
    num_layers, hidden, vocab = _size(config, key, text)
    experts = family.num_experts(text)
    tied = _tied(config, key, text)
    names = weight_names or []
    aux, aux_source = resolve_aux_layer_ids(num_layers, model.aux_layer_ids, family)
    vllm_arch = family.vllm_name(arch)
    quant = config.get("quantization_config") or text.get("quantization_config")
    return TargetSpec(
        name=model.name,
        model_type=str(config.get("model_type", "unknown")),
        architecture=arch,
        vllm_architecture=vllm_arch,
        vllm_eagle3_supported=vllm_arch in VLLM_EAGLE3_TARGETS,
        nested=key is not None,
        text_config_key=key,
        text_model_type=str(text.get("model_type", config.get("model_type", "unknown"))),
        num_layers=num_layers,
        hidden_size=hidden,
        vocab_size=vocab,
        **_attention(text, hidden),
        intermediate_size=int(_first(text, "intermediate_size", default=4 * hidden)),
        moe=experts > 0,
        num_experts=experts,
        aux_layer_ids=aux,
        aux_layer_ids_source=aux_source,
        weights=resolve_weight_names(names, tied, family),
        tie_word_embeddings=tied,
        weight_prefix=weight_prefix(names, family),
        quantization=quant.get("quant_method") if isinstance(quant, dict) else None,
        torch_dtype=_first(text, "dtype", "torch_dtype", default=config.get("torch_dtype")),
        max_position_embeddings=_first(text, "max_position_embeddings"),
        rope_type=rope_type(text),
        rms_norm_eps=float(_first(text, "rms_norm_eps", "layer_norm_epsilon", default=1e-6)),
        mla=_mla_dims(text),
        **_provenance(model),
    )


def describe_target(model_dir: Path, model: TargetSource) -> TargetSpec:
    """Describe a target directory: config, weight index and tokenizer files only."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ConfigError(f"model.path={model_dir}: directory does not exist")
    config = read_json(model_dir / "config.json", "config.json (is this a model directory?)")
    spec = describe_config(config, model, read_weight_names(model_dir))
    spec.chat_template = has_chat_template(model_dir)
    if spec.path is None:
        spec.path = str(model_dir)
    return spec


def load_target_spec(path: Path) -> TargetSpec:
    """Read ``target.json`` (written by the target stage) -- the one place later stages
    learn the aux layer ids and the target's shape from."""
    return TargetSpec.from_dict(read_json(Path(path), "target.json (run the target stage)"))
