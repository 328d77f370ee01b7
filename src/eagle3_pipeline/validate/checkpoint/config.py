"""The ``config.json`` rules of an EAGLE-3 draft, as vLLM and speculators read it.

Each rule is one function over one field or one group of related fields, so a trap
vLLM sets (a default that differs from speculators', a field it silently ignores) is
one place to read and fix. :func:`check_config` runs them in a fixed order -- the
report lists findings in that order -- and returns the tensor shapes the config
implies, or ``None`` when it does not define them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeGuard

from eagle3_pipeline.draft.layers import DRAFT_LAYERS
from eagle3_pipeline.targets.adapter import MlaDims
from eagle3_pipeline.validate.checkpoint.report import Report

# vLLM's llama_eagle3 sizes fc for this many aux states unless num_aux_hidden_states says so.
VLLM_DEFAULT_NUM_AUX = 3

TLC = "transformer_layer_config"
AUX_WHERE = "config.json:eagle_aux_hidden_state_layer_ids"


@dataclass
class CheckpointShape:
    """What the config says the draft's tensors must look like (not the training-side
    :class:`eagle3_pipeline.draft.shape.DraftShape`, which is resolved from the target)."""

    hidden: int
    target_hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    draft_vocab: int
    n_aux: int
    layer_type: str
    attention_bias: bool = False
    mlp_bias: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    mla: MlaDims | None = None  # an MLA draft layer's latent sizes


# --------------------------------------------------------------------------- field access


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_KIND_CHECKS = {
    "int": is_int,
    "number": _is_number,
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str) and v != "",
    "dict": lambda v: isinstance(v, dict),
    "list": lambda v: isinstance(v, list),
}


def require_field(
    report: Report,
    obj: dict[str, Any],
    key: str,
    where: str,
    kind: str,
    why: str = "",
) -> Any:
    """Report a missing or mistyped field; return the value when it is usable."""
    suffix = f" ({why})" if why else ""
    if key not in obj or obj[key] is None:
        report.error("field-missing", f"config.json:{where}", f"required {kind} is missing{suffix}")
        return None
    value = obj[key]
    if not _KIND_CHECKS[kind](value):
        report.error(
            "field-type",
            f"config.json:{where}",
            f"must be a {kind}, got {type(value).__name__} {value!r}",
        )
        return None
    return value


def require_eagle3(report: Report, obj: dict[str, Any], key: str, where: str) -> None:
    """A field that names the draft's kind: present, a string, and ``eagle3`` (vLLM picks
    its EAGLE-3 loader by it)."""
    value = require_field(report, obj, key, where, "str")
    if value is not None and value != "eagle3":
        report.error("model-type", f"config.json:{where}", f"is {value!r}, expected 'eagle3'")


# --------------------------------------------------------------------------- top level


def _check_detection(report: Report, config: dict[str, Any]) -> None:
    """vLLM treats a directory as a speculators draft only on these facts."""
    if "speculators_config" not in config:
        report.error(
            "vllm-detection",
            "config.json:speculators_config",
            "missing: vLLM will not recognise this directory as a speculators draft",
        )
    if "model_type" in config:
        report.error(
            "vllm-detection",
            "config.json:model_type",
            f"top-level model_type={config['model_type']!r} present: vLLM then reads it as a "
            "plain HF model, not a speculators draft",
        )
    require_eagle3(report, config, "speculators_model_type", "speculators_model_type")


def check_norm_before_residual(report: Report, config: dict[str, Any]) -> None:
    """vLLM defaults it to True, speculators to False: it must be written explicitly."""
    where = "config.json:norm_before_residual"
    if "norm_before_residual" not in config:
        report.error(
            "norm-before-residual",
            where,
            "not written: vLLM would default it to True, speculators to False, so the "
            "draft is served with a different layer than it was trained with",
        )
    elif not isinstance(config["norm_before_residual"], bool):
        report.error("field-type", where, f"must be a bool, got {config['norm_before_residual']!r}")


def check_draft_vocab(report: Report, config: dict[str, Any]) -> int | None:
    draft_vocab = require_field(
        report,
        config,
        "draft_vocab_size",
        "draft_vocab_size",
        "int",
        "speculators defaults it to 32000",
    )
    if draft_vocab is not None and draft_vocab <= 0:
        report.error("field-type", "config.json:draft_vocab_size", f"is {draft_vocab}, must be > 0")
        return None
    return draft_vocab


def check_flags(report: Report, config: dict[str, Any]) -> None:
    """Boolean layer options; the EAGLE-3.1 ones are read only by recent vLLM versions."""
    for flag in ("norm_before_fc", "fc_norm", "norm_output"):
        if flag in config and not isinstance(config[flag], bool):
            report.error(
                "field-type", f"config.json:{flag}", f"must be a bool, got {config[flag]!r}"
            )
    for flag in ("fc_norm", "norm_output"):
        if config.get(flag) is True:
            report.warning(
                "eagle31-flag",
                f"config.json:{flag}",
                "EAGLE-3.1 option: only recent vLLM versions read it; confirm on the serving "
                "vLLM before publishing",
            )


def check_aux_ids(report: Report, config: dict[str, Any]) -> list[int] | None:
    """vLLM falls back to the target's default layers without a word when they are absent."""
    aux = config.get("eagle_aux_hidden_state_layer_ids")
    ok = False
    if aux is None:
        report.error(
            "aux-ids-missing",
            AUX_WHERE,
            "missing: vLLM would silently tap the target's default layers (2, L//2, L-3), "
            "not the ones the draft was trained on",
        )
    elif not isinstance(aux, list) or not aux or not all(is_int(a) for a in aux):
        report.error("field-type", AUX_WHERE, f"must be a non-empty list of ints, got {aux!r}")
    elif len(set(aux)) != len(aux):
        report.error("field-type", AUX_WHERE, f"{aux} has duplicate ids")
    else:
        ok = True
    report.facts["aux_layer_ids"] = aux if ok else None
    return aux if ok else None


# --------------------------------------------------------------------------- speculators_config


def _check_speculators_config(report: Report, config: dict[str, Any]) -> None:
    """Algorithm, proposal methods (where vLLM reads K) and the verifier reference."""
    spec = config.get("speculators_config")
    if spec is not None and not isinstance(spec, dict):
        report.error(
            "field-type", "config.json:speculators_config", f"must be a dict, got {spec!r}"
        )
    spec = spec if isinstance(spec, dict) else {}  # absent: reported as vllm-detection
    k = None
    if spec:
        require_eagle3(report, spec, "algorithm", "speculators_config.algorithm")
        k = _check_proposal_methods(report, spec)
        _check_verifier(report, spec)
    report.facts["speculative_tokens"] = k


def _check_proposal_methods(report: Report, spec: dict[str, Any]) -> int | None:
    """The first method's K (``None`` when unusable) and the default method's name."""
    methods = require_field(
        report, spec, "proposal_methods", "speculators_config.proposal_methods", "list"
    )
    if methods is None:
        return None
    if not methods or not isinstance(methods[0], dict):
        report.error(
            "field-missing",
            "config.json:speculators_config.proposal_methods[0]",
            "needs at least one proposal method object",
        )
        return None
    k = require_field(
        report,
        methods[0],
        "speculative_tokens",
        "speculators_config.proposal_methods[0].speculative_tokens",
        "int",
        "vLLM reads K from here",
    )
    if k is not None and k <= 0:
        report.error(
            "speculative-tokens",
            "config.json:speculators_config.proposal_methods[0].speculative_tokens",
            f"is {k}, must be > 0",
        )
        k = None
    _check_default_proposal(report, spec, methods)
    return k


def _check_default_proposal(report: Report, spec: dict[str, Any], methods: list[Any]) -> None:
    """speculators refuses a default method that names no proposal method."""
    ptype = methods[0].get("proposal_type")
    dflt = spec.get("default_proposal_method")
    require_field(
        report,
        spec,
        "default_proposal_method",
        "speculators_config.default_proposal_method",
        "str",
    )
    if not isinstance(dflt, str) or ptype is None:
        return
    if dflt not in {m.get("proposal_type") for m in methods if isinstance(m, dict)}:
        report.error(
            "field-type",
            "config.json:speculators_config.default_proposal_method",
            f"{dflt!r} is not the proposal_type of any proposal method "
            "(speculators refuses to load it)",
        )


def _check_verifier(report: Report, spec: dict[str, Any]) -> None:
    verifier = require_field(report, spec, "verifier", "speculators_config.verifier", "dict")
    if verifier is None:
        return
    name = require_field(
        report,
        verifier,
        "name_or_path",
        "speculators_config.verifier.name_or_path",
        "str",
        "vLLM and speculators locate the target through it",
    )
    report.facts["verifier_name_or_path"] = name
    require_field(
        report,
        verifier,
        "architectures",
        "speculators_config.verifier.architectures",
        "list",
    )


# --------------------------------------------------------------------------- transformer_layer_config


def _check_layer_type(report: Report, tlc: dict[str, Any]) -> str | None:
    layer_type = require_field(report, tlc, "model_type", f"{TLC}.model_type", "str")
    speculators_types = [k.name for k in DRAFT_LAYERS.values() if not k.mla]
    if layer_type is not None and layer_type not in speculators_types:
        report.error(
            "layer-type",
            f"config.json:{TLC}.model_type",
            f"{layer_type!r}: vLLM builds EAGLE-3 draft layers from a speculators config only "
            f"for {', '.join(speculators_types)} (an MLA draft is served from a plain "
            "DeepSeek config)",
        )
        return None
    return layer_type


def _check_layer_dims(report: Report, tlc: dict[str, Any]) -> dict[str, Any]:
    """The layer's sizes by :class:`CheckpointShape` field; ``None`` where unusable."""
    hidden = require_field(report, tlc, "hidden_size", f"{TLC}.hidden_size", "int")
    layers = require_field(report, tlc, "num_hidden_layers", f"{TLC}.num_hidden_layers", "int")
    heads = require_field(report, tlc, "num_attention_heads", f"{TLC}.num_attention_heads", "int")
    inter = require_field(report, tlc, "intermediate_size", f"{TLC}.intermediate_size", "int")
    vocab = require_field(report, tlc, "vocab_size", f"{TLC}.vocab_size", "int")
    require_field(report, tlc, "rms_norm_eps", f"{TLC}.rms_norm_eps", "number")
    kv_heads = _optional_int(report, tlc, "num_key_value_heads", heads)
    head_dim = _check_head_dim(report, tlc, hidden, heads)
    if is_int(layers) and layers < 1:
        report.error(
            "field-type", f"config.json:{TLC}.num_hidden_layers", f"is {layers}, must be >= 1"
        )
        layers = None
    return {
        "hidden": hidden,
        "layers": layers,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate": inter,
        "vocab": vocab,
    }


def _optional_int(
    report: Report, tlc: dict[str, Any], key: str, default: Any, where: str = TLC
) -> Any:
    """``tlc[key]`` (or ``default``) when it is an int or absent; else an error and None.
    ``where``: the dict's path in config.json ("" for the top level)."""
    value = tlc.get(key, default)
    if value is not None and not is_int(value):
        path = f"{where}.{key}" if where else key
        report.error("field-type", f"config.json:{path}", f"must be an int, got {value!r}")
        return None
    return value


def _check_head_dim(
    report: Report, tlc: dict[str, Any], hidden: int | None, heads: int | None
) -> int | None:
    """Explicit ``head_dim``, else hidden // heads as transformers derives it."""
    head_dim = tlc.get("head_dim")
    if head_dim is None and is_int(hidden) and is_int(heads) and heads > 0:
        return hidden // heads
    if head_dim is not None and not is_int(head_dim):
        report.error(
            "field-type", f"config.json:{TLC}.head_dim", f"must be an int, got {head_dim!r}"
        )
        return None
    return head_dim


def check_target_hidden(report: Report, config: dict[str, Any], hidden: int | None) -> int | None:
    """speculators' EAGLE-3 draft is as wide as its target; absent means the same width."""
    target_hidden = config.get("target_hidden_size")
    if target_hidden is None:
        return hidden
    if not is_int(target_hidden):
        report.error(
            "field-type",
            "config.json:target_hidden_size",
            f"must be an int or null, got {target_hidden!r}",
        )
        return hidden
    if is_int(hidden) and target_hidden != hidden:
        report.error(
            "target-hidden",
            "config.json:target_hidden_size",
            f"{target_hidden} != draft hidden_size {hidden}: speculators' EAGLE-3 draft "
            "needs the target's width",
        )
    return target_hidden


def check_aux_count(
    report: Report, tlc: dict[str, Any], aux: list[int] | None, where: str = TLC
) -> int:
    """How many aux states fc is sized for; must agree with the aux ids.

    vLLM's llama draft reads num_aux_hidden_states from the layer config (the speculators
    path does not copy the aux ids into eagle_config), default 3; its MLA draft reads it
    from the top level of its plain config (``where=""``), default 3 as well.
    """
    n_aux = len(aux) if aux is not None else None
    nah = _optional_int(report, tlc, "num_aux_hidden_states", None, where)
    vllm_n_aux = nah if nah is not None else VLLM_DEFAULT_NUM_AUX
    report.facts["vllm_num_aux"] = vllm_n_aux
    if n_aux is not None and vllm_n_aux != n_aux:
        how = (
            f"num_aux_hidden_states={nah}"
            if nah is not None
            else f"no num_aux_hidden_states, so vLLM assumes {VLLM_DEFAULT_NUM_AUX}"
        )
        key = f"{where}.num_aux_hidden_states" if where else "num_aux_hidden_states"
        report.error(
            "aux-count",
            f"config.json:{key}",
            f"{how}, but eagle_aux_hidden_state_layer_ids has {n_aux} ids: vLLM would size fc "
            f"for {vllm_n_aux} aux states and fail (or mis-read) fc.weight; write "
            f"{key}={n_aux}",
        )
    return n_aux if n_aux is not None else vllm_n_aux


# --------------------------------------------------------------------------- entry


def check_config(report: Report, config: dict[str, Any]) -> CheckpointShape | None:
    """The config.json rules; return the expected shapes when the config allows it."""
    _check_detection(report, config)
    _check_speculators_config(report, config)
    check_norm_before_residual(report, config)
    draft_vocab = check_draft_vocab(report, config)
    check_flags(report, config)
    aux = check_aux_ids(report, config)

    tlc = require_field(report, config, TLC, TLC, "dict")
    if tlc is None:
        return None
    layer_type = _check_layer_type(report, tlc)
    dims = _check_layer_dims(report, tlc)
    target_hidden = check_target_hidden(report, config, dims["hidden"])
    n_aux = check_aux_count(report, tlc, aux)

    if (
        any(v is None for v in dims.values())
        or target_hidden is None  # only when hidden is, which dims already says
        or draft_vocab is None
        or layer_type is None
    ):
        return None
    return CheckpointShape(
        **dims,
        target_hidden=target_hidden,
        draft_vocab=draft_vocab,
        n_aux=n_aux,
        layer_type=layer_type,
        attention_bias=bool(tlc.get("attention_bias", False)),
        mlp_bias=bool(tlc.get("mlp_bias", False)),
        norm_before_fc=config.get("norm_before_fc") is True,
        fc_norm=config.get("fc_norm") is True,
    )
