"""Will vLLM and speculators load this EAGLE-3 draft correctly? Checked without either.

Why this exists: a draft that breaks vLLM's loading rules fails at serve time, on a GPU,
long after training -- or worse, it loads: vLLM leaves a tensor missing from the
checkpoint uninitialised without a word, serves the draft on the target's default aux
layers when ``eagle_aux_hidden_state_layer_ids`` is absent, sizes ``fc`` for 3 aux layers
unless told otherwise, and defaults ``norm_before_residual`` to the opposite of
speculators. Every such trap is a rule below (DESIGN.md section 4), read from vLLM's
``transformers_utils/configs/speculators`` and ``model_executor/models/llama_eagle3.py``.

The format rules read only ``config.json`` and safetensors headers, then the tensors one
at a time (NaN/Inf, ``d2t``), so they work without vLLM, without a GPU and without
importing speculators. Only the reload check imports speculators, lazily, through the
project's one reload function (:func:`eagle3_pipeline.compat.speculators.load_draft`).

Tensor names: speculators 0.9 ``save_pretrained`` writes ``fc.weight``,
``layers.{i}.self_attn.{q,k,v,o}_proj.weight``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``,
``layers.{i}.{input_layernorm,post_attention_layernorm}.weight``,
``layers.0.hidden_norm.weight``, ``norm.weight``, ``lm_head.weight``,
``embed_tokens.weight``, ``d2t`` (int64) and ``t2d`` (bool); it drops
``verifier_lm_head.weight`` and ``verifier_norm.weight`` (``_keys_to_ignore_on_save``).
vLLM renames ``midlayer.`` to ``layers.0.`` (older EAGLE-3 checkpoints), skips ``t2d``,
loads ``d2t`` into ``draft_id_to_target_id`` and prefixes everything but ``lm_head`` with
``model.``; any other name is an unknown parameter and fails the load.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle3_pipeline.targets.adapter import VLLM_EAGLE3_TARGETS, TargetSpec, read_safetensors_header

ERROR = "error"
WARNING = "warning"
INFO = "info"

# Layer types vLLM's speculators config path builds an EAGLE-3 draft from.
VLLM_DRAFT_LAYER_TYPES = ("llama", "qwen3")
# vLLM's llama_eagle3 sizes fc for this many aux states unless num_aux_hidden_states says so.
VLLM_DEFAULT_NUM_AUX = 3
# vLLM's renames applied to checkpoint names before matching parameters.
VLLM_RENAMES = (("midlayer.", "layers.0."),)
# Saved by older speculators / other trainers, rejected by vLLM as unknown parameters.
TRAINING_ONLY_TENSORS = ("verifier_lm_head.weight", "verifier_norm.weight")

FLOAT_DTYPES = ("F32", "F16", "BF16")
SAFETENSORS_INDEX = "model.safetensors.index.json"


# --------------------------------------------------------------------------- report


@dataclass
class Finding:
    """One line of the report: ``level``, a stable ``code`` and the file/field/tensor."""

    level: str  # error | warning | info
    code: str
    where: str
    message: str

    def line(self) -> str:
        return f"{self.level.upper():7} [{self.code}] {self.where}: {self.message}"


@dataclass
class Report:
    """Structured findings; ``ok`` means no errors (warnings do not fail a draft)."""

    draft_dir: str
    findings: list[Finding] = field(default_factory=list)
    serve_command: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)

    def add(self, level: str, code: str, where: str, message: str) -> None:
        self.findings.append(Finding(level, code, where, message))

    def error(self, code: str, where: str, message: str) -> None:
        self.add(ERROR, code, where, message)

    def warning(self, code: str, where: str, message: str) -> None:
        self.add(WARNING, code, where, message)

    def info(self, code: str, where: str, message: str) -> None:
        self.add(INFO, code, where, message)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == WARNING]

    @property
    def infos(self) -> list[Finding]:
        return [f for f in self.findings if f.level == INFO]

    @property
    def ok(self) -> bool:
        return not self.errors

    def codes(self, level: str | None = None) -> set[str]:
        return {f.code for f in self.findings if level is None or f.level == level}

    def to_dict(self) -> dict[str, Any]:
        return {
            "draft_dir": self.draft_dir,
            "ok": self.ok,
            "errors": [asdict(f) for f in self.errors],
            "warnings": [asdict(f) for f in self.warnings],
            "info": [asdict(f) for f in self.infos],
            "serve_command": self.serve_command,
            "facts": self.facts,
        }

    def format(self) -> str:
        verdict = "PASS" if self.ok else "FAIL"
        head = (
            f"{verdict}: {self.draft_dir} -- {len(self.errors)} error(s), "
            f"{len(self.warnings)} warning(s)"
        )
        order = {ERROR: 0, WARNING: 1, INFO: 2}
        lines = [f.line() for f in sorted(self.findings, key=lambda f: order[f.level])]
        if self.serve_command:
            lines.append(f"serve with: {self.serve_command}")
        return "\n".join([head, *lines])


# --------------------------------------------------------------------------- helpers


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _require(
    report: Report,
    obj: dict[str, Any],
    key: str,
    where: str,
    kind: str,
    why: str = "",
) -> Any:
    """Report a missing or mistyped field; return the value when it is usable."""
    checks = {
        "int": _is_int,
        "number": _is_number,
        "bool": lambda v: isinstance(v, bool),
        "str": lambda v: isinstance(v, str) and v != "",
        "dict": lambda v: isinstance(v, dict),
        "list": lambda v: isinstance(v, list),
    }
    suffix = f" ({why})" if why else ""
    if key not in obj or obj[key] is None:
        report.error("field-missing", f"config.json:{where}", f"required {kind} is missing{suffix}")
        return None
    value = obj[key]
    if not checks[kind](value):
        report.error(
            "field-type",
            f"config.json:{where}",
            f"must be a {kind}, got {type(value).__name__} {value!r}",
        )
        return None
    return value


def _fmt_shape(shape: Iterable[int]) -> str:
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


# --------------------------------------------------------------------------- config


@dataclass
class DraftShape:
    """What the config says the tensors must look like."""

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


def check_config(report: Report, config: dict[str, Any]) -> DraftShape | None:
    """The config.json rules; return the expected shapes when the config allows it."""
    # Detection: vLLM treats a directory as speculators-format only on these two facts.
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
    smt = _require(report, config, "speculators_model_type", "speculators_model_type", "str")
    if smt is not None and smt != "eagle3":
        report.error(
            "model-type",
            "config.json:speculators_model_type",
            f"is {smt!r}, expected 'eagle3'",
        )

    spec = config.get("speculators_config")
    if spec is not None and not isinstance(spec, dict):
        report.error(
            "field-type", "config.json:speculators_config", f"must be a dict, got {spec!r}"
        )
    spec = spec if isinstance(spec, dict) else {}  # absent: reported as vllm-detection
    k = None
    if spec:
        algo = _require(report, spec, "algorithm", "speculators_config.algorithm", "str")
        if algo is not None and algo != "eagle3":
            report.error(
                "model-type",
                "config.json:speculators_config.algorithm",
                f"is {algo!r}, expected 'eagle3'",
            )
        methods = _require(
            report, spec, "proposal_methods", "speculators_config.proposal_methods", "list"
        )
        if methods is not None:
            if not methods or not isinstance(methods[0], dict):
                report.error(
                    "field-missing",
                    "config.json:speculators_config.proposal_methods[0]",
                    "needs at least one proposal method object",
                )
            else:
                k = _require(
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
                ptype = methods[0].get("proposal_type")
                dflt = spec.get("default_proposal_method")
                _require(
                    report,
                    spec,
                    "default_proposal_method",
                    "speculators_config.default_proposal_method",
                    "str",
                )
                if (
                    isinstance(dflt, str)
                    and ptype is not None
                    and dflt not in {m.get("proposal_type") for m in methods if isinstance(m, dict)}
                ):
                    report.error(
                        "field-type",
                        "config.json:speculators_config.default_proposal_method",
                        f"{dflt!r} is not the proposal_type of any proposal method "
                        "(speculators refuses to load it)",
                    )
        verifier = _require(report, spec, "verifier", "speculators_config.verifier", "dict")
        if verifier is not None:
            name = _require(
                report,
                verifier,
                "name_or_path",
                "speculators_config.verifier.name_or_path",
                "str",
                "vLLM and speculators locate the target through it",
            )
            report.facts["verifier_name_or_path"] = name
            _require(
                report,
                verifier,
                "architectures",
                "speculators_config.verifier.architectures",
                "list",
            )
    report.facts["speculative_tokens"] = k

    # norm_before_residual: vLLM defaults True, speculators False -> must be explicit.
    nbr_where = "config.json:norm_before_residual"
    if "norm_before_residual" not in config:
        report.error(
            "norm-before-residual",
            nbr_where,
            "not written: vLLM would default it to True, speculators to False, so the "
            "draft is served with a different layer than it was trained with",
        )
    elif not isinstance(config["norm_before_residual"], bool):
        report.error(
            "field-type", nbr_where, f"must be a bool, got {config['norm_before_residual']!r}"
        )

    draft_vocab = _require(
        report,
        config,
        "draft_vocab_size",
        "draft_vocab_size",
        "int",
        "speculators defaults it to 32000",
    )
    if draft_vocab is not None and draft_vocab <= 0:
        report.error("field-type", "config.json:draft_vocab_size", f"is {draft_vocab}, must be > 0")
        draft_vocab = None
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

    # Aux layers: vLLM falls back to the target's default layers without a word.
    aux_where = "config.json:eagle_aux_hidden_state_layer_ids"
    aux = config.get("eagle_aux_hidden_state_layer_ids")
    aux_ok = False
    if aux is None:
        report.error(
            "aux-ids-missing",
            aux_where,
            "missing: vLLM would silently tap the target's default layers (2, L//2, L-3), "
            "not the ones the draft was trained on",
        )
    elif not isinstance(aux, list) or not aux or not all(_is_int(a) for a in aux):
        report.error("field-type", aux_where, f"must be a non-empty list of ints, got {aux!r}")
    elif len(set(aux)) != len(aux):
        report.error("field-type", aux_where, f"{aux} has duplicate ids")
    else:
        aux_ok = True
    report.facts["aux_layer_ids"] = aux if aux_ok else None

    tlc = _require(report, config, "transformer_layer_config", "transformer_layer_config", "dict")
    if tlc is None:
        return None
    w = "transformer_layer_config"
    layer_type = _require(report, tlc, "model_type", f"{w}.model_type", "str")
    if layer_type is not None and layer_type not in VLLM_DRAFT_LAYER_TYPES:
        report.error(
            "layer-type",
            f"config.json:{w}.model_type",
            f"{layer_type!r}: vLLM builds EAGLE-3 draft layers only for "
            f"{', '.join(VLLM_DRAFT_LAYER_TYPES)}",
        )
        layer_type = None
    if layer_type == "qwen3":
        report.warning(
            "layer-type",
            f"config.json:{w}.model_type",
            "qwen3 draft layers carry q_norm/k_norm; vLLM routes eagle3 drafts to its Llama "
            "draft class -- confirm the serving vLLM loads them",
        )
    hidden = _require(report, tlc, "hidden_size", f"{w}.hidden_size", "int")
    layers = _require(report, tlc, "num_hidden_layers", f"{w}.num_hidden_layers", "int")
    heads = _require(report, tlc, "num_attention_heads", f"{w}.num_attention_heads", "int")
    inter = _require(report, tlc, "intermediate_size", f"{w}.intermediate_size", "int")
    vocab = _require(report, tlc, "vocab_size", f"{w}.vocab_size", "int")
    _require(report, tlc, "rms_norm_eps", f"{w}.rms_norm_eps", "number")
    kv_heads = tlc.get("num_key_value_heads", heads)
    if kv_heads is not None and not _is_int(kv_heads):
        report.error(
            "field-type",
            f"config.json:{w}.num_key_value_heads",
            f"must be an int, got {kv_heads!r}",
        )
        kv_heads = None
    head_dim = tlc.get("head_dim")
    if head_dim is None and _is_int(hidden) and _is_int(heads) and heads > 0:
        head_dim = hidden // heads
    elif head_dim is not None and not _is_int(head_dim):
        report.error("field-type", f"config.json:{w}.head_dim", f"must be an int, got {head_dim!r}")
        head_dim = None
    if _is_int(layers) and layers < 1:
        report.error(
            "field-type", f"config.json:{w}.num_hidden_layers", f"is {layers}, must be >= 1"
        )
        layers = None

    target_hidden = config.get("target_hidden_size")
    if target_hidden is not None:
        if not _is_int(target_hidden):
            report.error(
                "field-type",
                "config.json:target_hidden_size",
                f"must be an int or null, got {target_hidden!r}",
            )
            target_hidden = None
        elif _is_int(hidden) and target_hidden != hidden:
            report.error(
                "target-hidden",
                "config.json:target_hidden_size",
                f"{target_hidden} != draft hidden_size {hidden}: speculators' EAGLE-3 draft "
                "needs the target's width",
            )
    if target_hidden is None:
        target_hidden = hidden

    # fc sizing: vLLM's llama draft reads num_aux_hidden_states from the layer config
    # (the speculators path does not copy the aux ids into eagle_config), default 3.
    n_aux = len(aux) if aux_ok else None
    nah = tlc.get("num_aux_hidden_states")
    if nah is not None and not _is_int(nah):
        report.error(
            "field-type", f"config.json:{w}.num_aux_hidden_states", f"must be an int, got {nah!r}"
        )
        nah = None
    vllm_n_aux = nah if nah is not None else VLLM_DEFAULT_NUM_AUX
    report.facts["vllm_num_aux"] = vllm_n_aux
    if n_aux is not None and vllm_n_aux != n_aux:
        how = (
            f"num_aux_hidden_states={nah}"
            if nah is not None
            else f"no num_aux_hidden_states, so vLLM assumes {VLLM_DEFAULT_NUM_AUX}"
        )
        report.error(
            "aux-count",
            f"config.json:{w}.num_aux_hidden_states",
            f"{how}, but eagle_aux_hidden_state_layer_ids has {n_aux} ids: vLLM would size fc "
            f"for {vllm_n_aux} aux states and fail (or mis-read) fc.weight; write "
            f"{w}.num_aux_hidden_states={n_aux}",
        )

    values = (hidden, layers, heads, kv_heads, head_dim, inter, vocab, draft_vocab, layer_type)
    if any(v is None for v in values):
        return None
    return DraftShape(
        hidden=hidden,
        target_hidden=target_hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=inter,
        vocab=vocab,
        draft_vocab=draft_vocab,
        n_aux=n_aux if n_aux is not None else vllm_n_aux,
        layer_type=layer_type,
        attention_bias=bool(tlc.get("attention_bias", False)),
        mlp_bias=bool(tlc.get("mlp_bias", False)),
        norm_before_fc=config.get("norm_before_fc") is True,
        fc_norm=config.get("fc_norm") is True,
    )


# --------------------------------------------------------------------------- weights


@dataclass
class TensorInfo:
    name: str  # as stored in the file
    dtype: str
    shape: list[int]
    file: str


def read_weight_headers(report: Report, draft_dir: Path) -> dict[str, TensorInfo] | None:
    """Tensor names, dtypes and shapes from the headers (sharded with index, or single)."""
    index_path = draft_dir / SAFETENSORS_INDEX
    tensors: dict[str, TensorInfo] = {}
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
            weight_map = index["weight_map"]
            assert isinstance(weight_map, dict)
        except (json.JSONDecodeError, KeyError, AssertionError, UnicodeDecodeError) as exc:
            report.error("weights-index", SAFETENSORS_INDEX, f"unreadable weight index ({exc})")
            return None
        headers: dict[str, dict[str, Any]] = {}
        for shard in sorted(set(weight_map.values())):
            path = draft_dir / shard
            if not path.is_file():
                report.error("weights-index", shard, f"listed in {SAFETENSORS_INDEX} but missing")
                continue
            headers[shard] = _header(report, path)
        for name, shard in weight_map.items():
            if shard not in headers:
                continue
            meta = headers[shard].get(name)
            if meta is None:
                report.error(
                    "weights-index",
                    f"{shard}:{name}",
                    f"in {SAFETENSORS_INDEX} but not in the shard",
                )
                continue
            tensors[name] = TensorInfo(name, meta["dtype"], list(meta["shape"]), shard)
        for shard, header in headers.items():
            for name in set(header) - set(weight_map):
                report.error(
                    "weights-index",
                    f"{shard}:{name}",
                    f"in the shard but not in {SAFETENSORS_INDEX} (vLLM would not load it)",
                )
        return tensors
    files = sorted(draft_dir.glob("*.safetensors"))
    if not files:
        other = sorted(p.name for p in draft_dir.glob("*.bin"))
        hint = f" (found {', '.join(other)}; save with safetensors)" if other else ""
        report.error("weights-missing", str(draft_dir), f"no *.safetensors weights{hint}")
        return None
    if len(files) > 1:
        report.warning(
            "weights-index",
            str(draft_dir),
            f"{len(files)} safetensors files without {SAFETENSORS_INDEX}",
        )
    for path in files:
        for name, meta in _header(report, path).items():
            if name in tensors:
                report.error(
                    "tensor-duplicate", f"{path.name}:{name}", f"also in {tensors[name].file}"
                )
            tensors[name] = TensorInfo(name, meta["dtype"], list(meta["shape"]), path.name)
    return tensors


def _header(report: Report, path: Path) -> dict[str, Any]:
    try:
        return read_safetensors_header(path)
    except Exception as exc:  # noqa: BLE001 - any unreadable header is one finding
        report.error("weights-unreadable", path.name, f"cannot read safetensors header ({exc})")
        return {}


def expected_tensors(shape: DraftShape) -> tuple[dict[str, tuple[list[int], str]], set[str]]:
    """(required name -> (shape, dtype kind), optional names) as vLLM's llama_eagle3 loads."""
    h, ht, hd = shape.hidden, shape.target_hidden, shape.head_dim
    req: dict[str, tuple[list[int], str]] = {
        "fc.weight": ([h, shape.n_aux * ht], "float"),
        "norm.weight": ([h], "float"),
        "lm_head.weight": ([shape.draft_vocab, h], "float"),
    }
    optional: dict[str, tuple[list[int], str]] = {
        "embed_tokens.weight": ([shape.vocab, h], "float"),
        "t2d": ([shape.vocab], "bool"),
    }
    d2t = ([shape.draft_vocab], "int64")
    if shape.draft_vocab != shape.vocab:
        req["d2t"] = d2t
    else:
        optional["d2t"] = d2t
    for i in range(shape.layers):
        p = f"layers.{i}."
        width = 2 * h if i == 0 else h
        attn = {
            "q_proj": [shape.heads * hd, width],
            "k_proj": [shape.kv_heads * hd, width],
            "v_proj": [shape.kv_heads * hd, width],
            "o_proj": [h, shape.heads * hd],
        }
        for proj, s in attn.items():
            req[f"{p}self_attn.{proj}.weight"] = (s, "float")
            if shape.attention_bias:
                req[f"{p}self_attn.{proj}.bias"] = ([s[0]], "float")
        mlp = {
            "gate_proj": [shape.intermediate, h],
            "up_proj": [shape.intermediate, h],
            "down_proj": [h, shape.intermediate],
        }
        for proj, s in mlp.items():
            req[f"{p}mlp.{proj}.weight"] = (s, "float")
            if shape.mlp_bias:
                req[f"{p}mlp.{proj}.bias"] = ([s[0]], "float")
        req[f"{p}input_layernorm.weight"] = ([h], "float")
        req[f"{p}post_attention_layernorm.weight"] = ([h], "float")
        # vLLM builds hidden_norm in every layer but only layer 0 uses it; speculators
        # writes it for layer 0 only.
        (req if i == 0 else optional)[f"{p}hidden_norm.weight"] = ([h], "float")
        if shape.layer_type == "qwen3":
            req[f"{p}self_attn.q_norm.weight"] = ([hd], "float")
            req[f"{p}self_attn.k_norm.weight"] = ([hd], "float")
    if shape.norm_before_fc:
        req["input_norm.weight"] = ([shape.n_aux * ht], "float")
    else:
        optional["input_norm.weight"] = ([shape.n_aux * ht], "float")  # vLLM skips it
    if shape.fc_norm:
        for i in range(shape.n_aux):
            req[f"fc_norm.{i}.weight"] = ([ht], "float")
    return {**req, **optional}, set(optional)


def vllm_name(name: str) -> str:
    """The name vLLM's loader matches after its renames."""
    for old, new in VLLM_RENAMES:
        if old in name:
            name = name.replace(old, new)
    return name


def check_weights(
    report: Report, tensors: dict[str, TensorInfo], shape: DraftShape | None
) -> dict[str, TensorInfo]:
    """Presence, unknown names, shapes and dtypes; returns tensors by vLLM name."""
    by_vllm: dict[str, TensorInfo] = {}
    for name, info in tensors.items():
        mapped = vllm_name(name)
        if mapped != name:
            report.info("tensor-renamed", name, f"vLLM loads it as {mapped}")
        by_vllm[mapped] = info
    report.facts["tensors"] = len(tensors)
    if shape is None:
        report.info(
            "weights-skipped",
            "config.json",
            "tensor shapes not checked: the config does not define them",
        )
        return by_vllm
    wanted, optional = expected_tensors(shape)
    for name, (want_shape, kind) in wanted.items():
        info = by_vllm.get(name)
        if info is None:
            if name not in optional:
                report.error(
                    "tensor-missing",
                    name,
                    f"missing (expected {_fmt_shape(want_shape)}): vLLM would leave it "
                    "uninitialised without an error",
                )
            continue
        where = f"{info.file}:{info.name}"
        if info.shape != want_shape:
            report.error(
                "tensor-shape",
                where,
                f"shape {_fmt_shape(info.shape)}, expected {_fmt_shape(want_shape)}",
            )
        if kind == "float" and info.dtype not in FLOAT_DTYPES:
            report.error("tensor-dtype", where, f"dtype {info.dtype}, expected F32/F16/BF16")
        elif kind == "int64" and info.dtype != "I64":
            report.error(
                "tensor-dtype",
                where,
                f"dtype {info.dtype}, expected I64 (vLLM's draft_id_to_target_id)",
            )
        elif kind == "bool" and info.dtype != "BOOL":
            report.warning(
                "tensor-dtype", where, f"dtype {info.dtype}, expected BOOL (vLLM ignores t2d)"
            )
    float_dtypes = sorted({i.dtype for i in tensors.values() if i.dtype in FLOAT_DTYPES})
    if len(float_dtypes) > 1:
        report.warning("tensor-dtype", "model weights", f"mixed float dtypes {float_dtypes}")
    report.facts["dtype"] = float_dtypes[0] if len(float_dtypes) == 1 else float_dtypes
    for name in sorted(set(by_vllm) - set(wanted)):
        info = by_vllm[name]
        where = f"{info.file}:{info.name}"
        if name in TRAINING_ONLY_TENSORS:
            report.error(
                "tensor-unknown",
                where,
                "training-only tensor: vLLM has no such parameter and fails the load "
                "(speculators' save_pretrained drops it)",
            )
        elif name == "mask_hidden":
            report.warning(
                "tensor-unknown",
                where,
                "parallel-drafting tensor: vLLM skips it unless parallel drafting is on",
            )
        else:
            report.error("tensor-unknown", where, "vLLM has no such parameter and fails the load")
    if "embed_tokens.weight" not in by_vllm:
        report.info(
            "embed-tokens", "embed_tokens.weight", "not saved: vLLM shares the target's embeddings"
        )
    return by_vllm


# numpy dtypes for the safetensors dtypes read raw; BF16 is widened by hand (numpy has none).
_NUMPY_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "BOOL": "?",
}
_CHUNK = 1 << 24  # elements per NaN/Inf pass: bounds memory on a multi-GB embedding


def _open_raw(path: Path) -> tuple[Any, int, dict[str, Any]]:
    """(memory map, data start, header) of a safetensors file, read without torch."""
    import mmap
    import struct

    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    return mm, 8 + n, header


def _nonfinite(mm: Any, base: int, meta: dict[str, Any]) -> int:
    import numpy as np

    start, end = meta["data_offsets"]
    raw = np.frombuffer(
        mm,
        dtype=_NUMPY_DTYPES[meta["dtype"]],
        count=(end - start) // np.dtype(_NUMPY_DTYPES[meta["dtype"]]).itemsize,
        offset=base + start,
    )
    bad = 0
    for i in range(0, raw.size, _CHUNK):
        chunk = raw[i : i + _CHUNK]
        if meta["dtype"] == "BF16":
            chunk = (chunk.astype(np.uint32) << 16).view(np.float32)
        bad += int(chunk.size - np.isfinite(chunk).sum())
    return bad


def _array(mm: Any, base: int, meta: dict[str, Any]) -> Any:
    import numpy as np

    start, end = meta["data_offsets"]
    dt = np.dtype(_NUMPY_DTYPES[meta["dtype"]])
    return np.frombuffer(mm, dtype=dt, count=(end - start) // dt.itemsize, offset=base + start)


def check_tensor_values(
    report: Report,
    draft_dir: Path,
    by_vllm: dict[str, TensorInfo],
    target_vocab: int | None,
) -> None:
    """NaN/Inf in float tensors; d2t offsets inside the target vocabulary, no duplicates.

    Reads the raw bytes with numpy (bf16 widened by hand): no torch import, one tensor
    at a time, so a 1T target's draft with a multi-GB embedding is checked in bounded memory.
    """
    by_file: dict[str, list[TensorInfo]] = {}
    for info in by_vllm.values():
        by_file.setdefault(info.file, []).append(info)
    d2t = t2d = None
    for fname, infos in sorted(by_file.items()):
        try:
            mm, base, header = _open_raw(draft_dir / fname)
        except Exception as exc:  # noqa: BLE001 - an unreadable file is one finding
            report.error("weights-unreadable", fname, f"cannot open ({exc})")
            continue
        try:
            for info in sorted(infos, key=lambda i: i.name):
                meta = header[info.name]
                where = f"{fname}:{info.name}"
                if meta["dtype"] not in _NUMPY_DTYPES:
                    report.warning("tensor-dtype", where, f"{meta['dtype']}: values not checked")
                    continue
                try:
                    if meta["dtype"] in ("F64", "F32", "F16", "BF16"):
                        bad = _nonfinite(mm, base, meta)
                        if bad:
                            n = max(1, int(_prod(info.shape)))
                            report.error("nonfinite", where, f"{bad} of {n} values are NaN/Inf")
                    elif vllm_name(info.name) == "d2t":
                        d2t = _array(mm, base, meta).copy()
                    elif vllm_name(info.name) == "t2d":
                        t2d = _array(mm, base, meta).astype(bool)
                except (ValueError, TypeError) as exc:
                    report.error("weights-unreadable", where, f"cannot read ({exc})")
        finally:
            with contextlib.suppress(BufferError):  # a view still alive: GC closes it
                mm.close()
    if d2t is not None:
        _check_d2t(report, d2t, t2d, target_vocab)


def _prod(shape: list[int]) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


def _check_d2t(report: Report, d2t: Any, t2d: Any, target_vocab: int | None) -> None:
    import numpy as np

    if d2t.ndim != 1 or d2t.dtype.kind not in "iu":
        return  # shape/dtype already reported
    ids = np.arange(d2t.size, dtype=np.int64) + d2t.astype(np.int64)
    if target_vocab is not None:
        bad = np.flatnonzero((ids < 0) | (ids >= target_vocab))
        if bad.size:
            i = int(bad[0])
            report.error(
                "d2t-range",
                "d2t",
                f"{bad.size} offsets leave the target vocabulary [0, {target_vocab}): "
                f"first at draft id {i}: {i} + d2t[{i}] = {int(ids[i])}",
            )
    n_unique = np.unique(ids).size
    if n_unique != ids.size:
        report.error(
            "d2t-duplicate",
            "d2t",
            f"{ids.size - n_unique} draft ids map to a target id already taken: "
            "vLLM scatters logits by these ids, so one draft token would be lost",
        )
    if t2d is not None and t2d.ndim == 1:
        valid = ids[(ids >= 0) & (ids < t2d.size)]
        if int(t2d.sum()) != d2t.size or not bool(t2d[valid].all()):
            report.warning(
                "t2d",
                "t2d",
                "does not mark exactly the target ids d2t maps to "
                "(vLLM ignores t2d; speculators uses it to slice the verifier lm_head)",
            )


# --------------------------------------------------------------------------- target


def check_against_target(
    report: Report,
    shape: DraftShape | None,
    spec: TargetSpec,
    expected_aux_ids: list[int] | None,
) -> None:
    """Was this draft trained for this target, on the layers the hidden states came from?"""
    tw = "target.json"
    if spec.vllm_architecture not in VLLM_EAGLE3_TARGETS:
        report.error(
            "target-arch",
            f"{tw}:vllm_architecture",
            f"{spec.vllm_architecture!r} (transformers: {spec.architecture}) is not a vLLM "
            "EAGLE-3 target: vLLM cannot hand it aux hidden states",
        )
    elif spec.vllm_architecture != spec.architecture:
        report.info(
            "target-arch",
            f"{tw}:vllm_architecture",
            f"vLLM registers {spec.architecture} as {spec.vllm_architecture}",
        )
    if shape is not None:
        if shape.target_hidden != spec.hidden_size or shape.hidden != spec.hidden_size:
            report.error(
                "target-hidden",
                "config.json:transformer_layer_config.hidden_size",
                f"draft width {shape.hidden} (target_hidden {shape.target_hidden}) != the "
                f"target's hidden_size {spec.hidden_size}: trained for another target",
            )
        if shape.vocab != spec.vocab_size:
            report.error(
                "target-vocab",
                "config.json:transformer_layer_config.vocab_size",
                f"{shape.vocab} != the target's vocab_size {spec.vocab_size}: trained for "
                "another target (or tokenizer)",
            )
        if shape.draft_vocab > spec.vocab_size:
            report.error(
                "target-vocab",
                "config.json:draft_vocab_size",
                f"{shape.draft_vocab} > the target's vocab_size {spec.vocab_size}",
            )
    aux = report.facts.get("aux_layer_ids")
    if aux:
        out = [a for a in aux if a < 0 or a > spec.num_layers]
        if out:
            report.error(
                "aux-ids-range",
                "config.json:eagle_aux_hidden_state_layer_ids",
                f"{out} outside [0, {spec.num_layers - 1}] for a {spec.num_layers}-layer target",
            )
        elif spec.num_layers in aux:
            report.warning(
                "aux-ids-range",
                "config.json:eagle_aux_hidden_state_layer_ids",
                f"id {spec.num_layers} is the target's final hidden state: only vLLM versions "
                "whose target backbone returns it can serve this draft",
            )
        want = list(expected_aux_ids) if expected_aux_ids is not None else list(spec.aux_layer_ids)
        if list(aux) != want:
            report.error(
                "aux-ids-mismatch",
                "config.json:eagle_aux_hidden_state_layer_ids",
                f"{list(aux)} != {want}, the layers the hidden states were extracted at: vLLM "
                "would feed the draft other layers than it was trained on",
            )
    name = report.facts.get("verifier_name_or_path")
    k = report.facts.get("speculative_tokens")
    if spec.hub_id:
        if name is not None and name != spec.hub_id:
            report.error(
                "verifier-id",
                "config.json:speculators_config.verifier.name_or_path",
                f"{name!r}, expected the target's hub id {spec.hub_id!r}: a published draft must "
                "name its target so `vllm serve DRAFT` and speculators can find it",
            )
    elif name is not None and not _looks_local(name):
        report.warning(
            "verifier-id",
            "config.json:speculators_config.verifier.name_or_path",
            f"{name!r} looks like a hub id, but target.json records none: `vllm serve DRAFT` "
            "would fetch that model; serve with --speculative-config (below)",
        )
    elif name is not None:
        report.info(
            "verifier-id",
            "config.json:speculators_config.verifier.name_or_path",
            f"{name!r}: a local target; serve with an explicit --speculative-config (below)",
        )
    target_ref = spec.hub_id or spec.path or name
    if target_ref and k:
        report.serve_command = serve_command(target_ref, report.draft_dir, k)


def serve_command(target: str, draft_dir: str, k: int) -> str:
    """The ``vllm serve`` line that loads this draft without relying on name_or_path (the
    validate stage's engines add dtype, parallel sizes and workarounds to it)."""
    from eagle3_pipeline.serving.engine import eagle3_config

    spec = json.dumps(eagle3_config(Path(draft_dir).resolve(), k), separators=(",", ":"))
    return f"vllm serve {target} --speculative-config '{spec}'"


def _looks_local(name: str) -> bool:
    return (
        name.startswith(("/", "./", "../", "~"))
        or Path(name).exists()
        or not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", name)
    )


# --------------------------------------------------------------------------- reload


def check_reload(report: Report, draft_dir: Path, verifier_dir: Path | None) -> None:
    """Does speculators itself reload it? Config always; the model when a verifier is local."""
    try:
        from speculators import SpeculatorModelConfig
    except ImportError as exc:
        report.warning(
            "reload-skipped", "speculators", f"not importable ({exc}): reload not checked"
        )
        return
    try:
        cfg = SpeculatorModelConfig.from_pretrained(str(draft_dir))
    except Exception as exc:  # noqa: BLE001 - any refusal is the finding
        report.error("reload", "config.json", f"speculators refuses the config: {_one_line(exc)}")
        return
    if type(cfg).__name__ != "Eagle3SpeculatorConfig":
        report.error("reload", "config.json", f"speculators reads it as {type(cfg).__name__}")
        return
    if verifier_dir is None:
        report.warning(
            "reload-skipped",
            "config.json:speculators_config.verifier.name_or_path",
            "no local target directory: speculators parsed the config but the model reload "
            "(which reads the verifier) was not run; pass --target",
        )
        return
    from eagle3_pipeline.compat.speculators import load_draft

    try:
        model = load_draft(draft_dir, verifier_dir)
    except Exception as exc:  # noqa: BLE001
        report.error(
            "reload",
            str(draft_dir),
            f"speculators cannot reload the draft (verifier {verifier_dir}): {_one_line(exc)}",
        )
        return
    import torch

    bad = [
        n
        for n, p in model.state_dict().items()
        if p.is_floating_point() and not bool(torch.isfinite(p).all())
    ]
    if bad:
        report.error(
            "reload",
            str(draft_dir),
            f"after speculators' reload these are NaN/Inf (never loaded): {bad[:5]}",
        )
    else:
        report.info("reload", str(draft_dir), f"speculators reloads it (verifier {verifier_dir})")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:400]}"


# --------------------------------------------------------------------------- entry


def validate_checkpoint(
    draft_dir: str | Path,
    target_spec: TargetSpec | None,
    expected_aux_ids: list[int] | None = None,
    *,
    verifier_dir: str | Path | None = None,
    reload: bool = True,
) -> Report:
    """Check a draft directory the way vLLM and speculators would read it.

    ``expected_aux_ids`` are the layers the training hidden states were extracted at
    (default: ``target_spec.aux_layer_ids``). ``verifier_dir`` is the local target used for
    the reload (default: ``target_spec.path``, else a local ``verifier.name_or_path``).
    """
    draft_dir = Path(draft_dir)
    report = Report(str(draft_dir))
    config_path = draft_dir / "config.json"
    if not config_path.is_file():
        report.error("config-missing", str(config_path), "not found")
        return report
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        report.error("config-missing", str(config_path), f"not valid JSON ({exc})")
        return report
    if not isinstance(config, dict):
        report.error("config-missing", str(config_path), "must be a JSON object")
        return report

    shape = check_config(report, config)
    config_errors = bool(report.errors)
    tensors = read_weight_headers(report, draft_dir)
    if tensors is not None:
        by_vllm = check_weights(report, tensors, shape)
        target_vocab = target_spec.vocab_size if target_spec else (shape.vocab if shape else None)
        check_tensor_values(report, draft_dir, by_vllm, target_vocab)

    if target_spec is not None:
        check_against_target(report, shape, target_spec, expected_aux_ids)
    else:
        name = report.facts.get("verifier_name_or_path")
        if expected_aux_ids is not None and report.facts.get("aux_layer_ids") is not None:
            if list(report.facts["aux_layer_ids"]) != list(expected_aux_ids):
                report.error(
                    "aux-ids-mismatch",
                    "config.json:eagle_aux_hidden_state_layer_ids",
                    f"{report.facts['aux_layer_ids']} != extraction ids {list(expected_aux_ids)}",
                )
        if name and _looks_local(name):
            report.warning(
                "verifier-id",
                "config.json:speculators_config.verifier.name_or_path",
                f"{name!r} looks like a local path: `vllm serve DRAFT` needs a hub id there; "
                "serve with --speculative-config instead",
            )
        report.info("target-skipped", "target.json", "no target given: target checks not run")
        k = report.facts.get("speculative_tokens")
        if name and k:
            report.serve_command = serve_command(name, str(draft_dir), k)

    if reload:
        if config_errors:
            report.info("reload-skipped", "config.json", "config errors above: reload not tried")
        else:
            check_reload(report, draft_dir, _verifier_dir(report, target_spec, verifier_dir))
    return report


def _verifier_dir(
    report: Report, spec: TargetSpec | None, explicit: str | Path | None
) -> Path | None:
    candidates = [explicit, spec.path if spec else None, report.facts.get("verifier_name_or_path")]
    for cand in candidates:
        if cand and (Path(cand) / "config.json").is_file():
            return Path(cand)
    return None
