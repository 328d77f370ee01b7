"""The EAGLE-3 draft's shape, vocabulary and speculators config, derived from the target.

Why not speculators' own ``create_transformer_layer_config``: it copies the verifier's
attention geometry and MLP width. For an MLA + MoE target (Kimi-K2.5) that gives a draft
layer with ``head_dim = qk_rope_head_dim``, kv heads = attention heads and the 18,432-wide
dense MLP -- shapes nobody chose. Here every draft dimension has an explicit rule (or a
``train.draft.*`` override), and the layer type is always one vLLM can serve.

Why the vocabulary is built here: speculators' CLI helper caches ``d2t``/``t2d`` inside
the data directory it reads, which would modify the prepare stage's DVC output. This
module builds them in memory with speculators' ``build_vocab_mappings_from_distribution``
after forcing the end-of-turn and reasoning-marker tokens into the selection (a draft
that cannot propose end-of-turn loses a token at the end of every answer).

Nothing here imports speculators or torch at module import time.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config import (
    ConfigError,
    DraftShapeConfig,
    TrainConfig,
    norm_before_fc_on,
)
from eagle3_pipeline.draft.layers import DRAFT_LAYERS, config_class
from eagle3_pipeline.targets.adapter import MlaDims, TargetSpec, read_json, split_text_config
from eagle3_pipeline.targets.families import reasoning_markers

# Every registered family's reasoning markers; those in a target's vocabulary are kept.
REASONING_MARKER_CANDIDATES = reasoning_markers()


@dataclass(frozen=True)
class DraftShape:
    """The resolved decoder-layer shape of the draft (what goes into config.json); the
    train record holds it as it is (``draft_shape``)."""

    layer_type: str  # train.draft.layer_type: llama, qwen3 or mla
    num_layers: int  # decoder layers of the draft
    hidden_size: int  # the target's (fc and the frozen embeddings / lm_head require it)
    num_attention_heads: int  # attention heads
    num_key_value_heads: int  # key/value heads (GQA groups)
    head_dim: int  # per head
    intermediate_size: int  # the MLP's width
    rms_norm_eps: float  # the target's RMSNorm epsilon
    max_position_embeddings: int  # the target's (4096 when it sets none)
    # The latent sizes of an MLA draft layer (the target's own); None for llama / qwen3.
    mla: MlaDims | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_draft_shape(draft: DraftShapeConfig, spec: TargetSpec) -> DraftShape:
    """Draft dimensions: each ``train.draft.*`` value, else a rule over the target's shape.

    Rules for unset values: hidden size = the target's (speculators' ``fc`` and the frozen
    embeddings / lm_head require it); attention heads = the target's; for standard
    attention head_dim and kv heads are the target's, for MLA (no single head_dim, no GQA
    grouping) head_dim = hidden / heads and kv heads = heads; MLP width = the target's dense
    width for a dense target, 2 x hidden for a MoE target, whose dense ``intermediate_size``
    belongs to a few dense layers, not to its per-token compute.
    """
    if draft.hidden_size is not None and draft.hidden_size != spec.hidden_size:
        raise ConfigError(
            f"train.draft.hidden_size={draft.hidden_size} differs from the target's hidden size "
            f"{spec.hidden_size}: an EAGLE-3 draft shares the target's width (leave it null)"
        )
    if draft.num_layers < 1:
        raise ConfigError(f"train.draft.num_layers={draft.num_layers} must be >= 1")
    hidden = spec.hidden_size
    heads = draft.num_attention_heads or spec.num_attention_heads
    mla = spec.attention == "mla"
    mla_dims = _mla_layer_dims(draft, spec)
    if mla_dims is not None:
        head_dim = mla_dims.qk_nope_head_dim + mla_dims.qk_rope_head_dim
    elif draft.head_dim is not None:
        head_dim = draft.head_dim
    elif mla:
        head_dim = hidden // heads
    else:
        head_dim = spec.head_dim
    if draft.num_key_value_heads is not None:
        kv = draft.num_key_value_heads
    elif mla or mla_dims is not None or heads % max(1, spec.num_key_value_heads) != 0:
        kv = heads
    else:
        kv = spec.num_key_value_heads
    if heads % kv != 0:
        raise ConfigError(
            f"train.draft: num_attention_heads={heads} is not a multiple of "
            f"num_key_value_heads={kv}"
        )
    if draft.intermediate_size is not None:
        width = draft.intermediate_size
    elif spec.moe:
        width = 2 * hidden
    else:
        width = spec.intermediate_size
    for key, value in (
        ("num_attention_heads", heads),
        ("head_dim", head_dim),
        ("intermediate_size", width),
    ):
        if value < 1:
            raise ConfigError(f"train.draft.{key}={value} must be >= 1")
    return DraftShape(
        layer_type=draft.layer_type,
        num_layers=draft.num_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        intermediate_size=width,
        rms_norm_eps=spec.rms_norm_eps,
        max_position_embeddings=int(spec.max_position_embeddings or 4096),
        mla=mla_dims,
    )


def _mla_layer_dims(draft: DraftShapeConfig, spec: TargetSpec) -> MlaDims | None:
    """An MLA draft layer copies its target's latent sizes (vLLM picks the MLA kernel by
    them; on the CPU build the target and its draft must share CPU_MLA and its block size
    of 16). Refused for a target without MLA, and with a head_dim or kv-head override,
    which MLA has no use for.

    The query's low rank is the one size the draft does not always copy: vLLM 0.32's
    ``deepseek_eagle3`` renames ``kv_a_proj_with_mqa`` to ``fused_qkv_a_proj``
    unconditionally, and ``DeepseekV2MLAAttention`` builds that fused projection only when
    ``q_lora_rank`` is set -- a draft with one full ``q_proj`` cannot load. So for a target
    without a query low rank (``q_lora_rank: null``) the draft gets one of its own
    (:func:`draft_q_lora_rank`); the draft's query path is trained from scratch either way.
    """
    if not DRAFT_LAYERS[str(draft.layer_type)].mla:
        return None
    if spec.mla is None:
        raise ConfigError(
            f"train.draft.layer_type=mla: the target {spec.name} has no MLA attention "
            "(no kv_lora_rank in its config) to copy the latent sizes from; use "
            "train.draft.layer_type=llama"
        )
    for key in ("head_dim", "num_key_value_heads"):
        if getattr(draft, key) is not None:
            raise ConfigError(
                f"train.draft.{key}={getattr(draft, key)}: an MLA draft layer takes its "
                "head sizes from the target's latent attention; leave it null"
            )
    if spec.mla.q_lora_rank is None:
        return replace(spec.mla, q_lora_rank=draft_q_lora_rank(spec.mla, spec.hidden_size))
    return spec.mla


def draft_q_lora_rank(target: MlaDims, hidden_size: int) -> int:
    """The query low rank of an MLA draft whose target has none: the keys' and values'
    latent width (``kv_lora_rank``), at most the residual stream's width. DeepSeek-V2-Lite
    (hidden 2048, kv 512) gets 512; the tiny Kimi with ``q_lora_rank=null`` (hidden 128)
    gets 128, fewer weights than the full ``q_proj`` it replaces."""
    return min(target.kv_lora_rank, hidden_size)


def estimate_parameters(
    shape: DraftShape,
    n_aux: int,
    draft_vocab_size: int,
    target_vocab_size: int,
    options: DraftShapeConfig,
) -> tuple[int, int]:
    """``(trainable, frozen)`` parameter counts of the ``Eagle3DraftModel`` this shape
    builds, without building it (the train stage picks DDP or FSDP from them).

    Trainable: ``fc`` (n_aux * H -> H), the decoder layers (the first one's q/k/v read
    2 * H: embeddings and hidden state; it also has ``hidden_norm``; qwen3 adds q/k norms)
    and the final norm. Frozen (speculators 0.9 loads them from the target and does not
    train them): the embeddings (target vocab x H), the draft ``lm_head`` and the
    ``verifier_lm_head`` (the target's lm_head rows for the draft vocab, draft vocab x H
    each) and the verifier's final norm. The EAGLE-3.1 ``options``: ``norm_before_fc`` one
    RMSNorm over the n_aux * H concatenation, ``fc_norm`` one per aux state (n_aux * H
    either way); ``norm_output`` reuses the final norm. A test checks the count against
    the built model.
    """
    h, hd = shape.hidden_size, shape.head_dim
    q, kv = shape.num_attention_heads * hd, shape.num_key_value_heads * hd

    def layer(first: bool) -> int:
        inp = 2 * h if first else h
        if shape.mla is not None:
            return (
                _mla_layer_parameters(shape, inp)
                + 3 * h * shape.intermediate_size
                + (2 * h + (h if first else 0))
            )
        qk_norm = 2 * hd if DRAFT_LAYERS[shape.layer_type].qk_norm else 0
        norms = 2 * h + (h if first else 0) + qk_norm
        return inp * (q + 2 * kv) + q * h + 3 * h * shape.intermediate_size + norms

    trainable = n_aux * h * h + sum(layer(i == 0) for i in range(shape.num_layers)) + h
    if norm_before_fc_on(options) or options.fc_norm:
        trainable += n_aux * h
    frozen = target_vocab_size * h + 2 * draft_vocab_size * h + h
    return trainable, frozen


def _mla_layer_parameters(shape: DraftShape, inp: int) -> int:
    """MLA attention's weights for an input ``inp`` wide: the q path (low rank with its norm,
    or one projection), the joint latent + rope projection, the latent norm, the up
    projection to per-head keys and values, and the output projection."""
    m, heads = shape.mla, shape.num_attention_heads
    assert m is not None
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    if m.q_lora_rank is None:
        q = inp * heads * qk
    else:
        q = inp * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * heads * qk
    kv_a = inp * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
    kv_b = m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
    return q + kv_a + kv_b + heads * m.v_head_dim * shape.hidden_size


def check_train_config(train: TrainConfig, spec: TargetSpec) -> DraftShape:
    """Refuse what only the target can rule out (the schema's bounds and cross-key rules
    were checked at compose); return the draft's shape."""
    if train.draft_vocab_size > spec.vocab_size:
        raise ConfigError(
            f"train.draft_vocab_size={train.draft_vocab_size} is larger than the target "
            f"vocabulary ({spec.vocab_size} tokens)"
        )
    return resolve_draft_shape(train.draft, spec)


# --------------------------------------------------------------------------- vocabulary


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def special_token_ids(model_dir: str | Path) -> dict[str, int]:
    """End-of-turn / eos and reasoning-marker token ids of a target, from its tokenizer
    files (JSON only: a remote-code tokenizer such as Kimi's need not be importable).

    Returns ``{token text: id}``; raises :class:`ConfigError` when no eos can be found.
    """
    model_dir = Path(model_dir)
    tok_cfg = _read_json(model_dir / "tokenizer_config.json")
    vocab: dict[str, int] = {}
    for entry in _read_json(model_dir / "tokenizer.json").get("added_tokens", []) or []:
        if isinstance(entry, dict) and "content" in entry and "id" in entry:
            vocab[str(entry["content"])] = int(entry["id"])
    for tid, entry in (tok_cfg.get("added_tokens_decoder") or {}).items():
        if isinstance(entry, dict) and "content" in entry:
            vocab.setdefault(str(entry["content"]), int(tid))
    found: dict[str, int] = {}
    eos = tok_cfg.get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    if isinstance(eos, str) and eos in vocab:
        found[eos] = vocab[eos]
    for source in (
        _read_json(model_dir / "generation_config.json"),
        _read_json(model_dir / "config.json"),
    ):
        ids = source.get("eos_token_id")
        for tid in ids if isinstance(ids, list) else [ids]:
            if isinstance(tid, int):
                name = next((k for k, v in vocab.items() if v == tid), f"<eos id {tid}>")
                found.setdefault(name, tid)
    if not found:
        raise ConfigError(
            f"{model_dir}: cannot find the end-of-turn (eos) token in tokenizer_config.json, "
            "tokenizer.json or generation_config.json"
        )
    for marker in REASONING_MARKER_CANDIDATES:
        if marker in vocab:
            found[marker] = vocab[marker]
    return found


def build_vocab_mapping(
    token_freq: dict[int, int],
    draft_vocab_size: int,
    target_vocab_size: int,
    required_ids: list[int],
) -> tuple[Any, Any]:
    """``(d2t, t2d)`` for the ``draft_vocab_size`` most frequent supervised tokens, always
    including ``required_ids`` -- built with speculators' own function, in memory."""
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    if draft_vocab_size > target_vocab_size:
        raise ConfigError(
            f"train.draft_vocab_size={draft_vocab_size} is larger than the target "
            f"vocabulary ({target_vocab_size} tokens)"
        )
    bad = [t for t in required_ids if not 0 <= t < target_vocab_size]
    if bad:
        raise ConfigError(f"special token ids {bad} are outside the target vocabulary")
    if len(set(required_ids)) > draft_vocab_size:
        raise ConfigError(
            f"train.draft_vocab_size={draft_vocab_size} cannot hold the {len(required_ids)} "
            "tokens that must always be in it (end-of-turn, reasoning markers)"
        )
    freq = {int(k): int(v) for k, v in token_freq.items() if 0 <= int(k) < target_vocab_size}
    top = max(freq.values(), default=0) + 1
    for tid in required_ids:
        freq[int(tid)] = top  # ranked first, ties broken by id
    return build_vocab_mappings_from_distribution(freq, draft_vocab_size, target_vocab_size)


def load_token_freq(path: str | Path) -> dict[int, int]:
    import torch

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: token frequencies not found (run the prepare stage)")
    data = torch.load(p, weights_only=True)
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{p}: expected a non-empty dict token id -> count")
    return {int(k): int(v) for k, v in data.items()}


# --------------------------------------------------------------------------- the model


def transformer_layer_config(
    shape: DraftShape, vocab_size: int, n_aux: int, attn: str, rope: dict[str, Any] | None = None
) -> Any:
    """The draft decoder config (its layer type's class), with vLLM's fields written
    explicitly. ``rope``: the target's rope keys (an MLA draft shares the target's rope)."""
    if shape.mla is not None:
        cfg = _mla_layer_config(shape, vocab_size, rope or {})
    else:
        cfg = _standard_layer_config(shape, vocab_size)
    # vLLM sizes the llama draft's fc for 3 aux states unless told otherwise.
    cfg.num_aux_hidden_states = n_aux
    if attn == "sdpa_packed":
        from eagle3_pipeline.draft.packed_attention import register

        register()
    cfg._attn_implementation = attn
    return cfg


def _mla_layer_config(shape: DraftShape, vocab_size: int, rope: dict[str, Any]) -> Any:
    from eagle3_pipeline.draft import mla

    m = shape.mla
    assert m is not None
    mla.register()
    return mla.layer_config(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_layers=shape.num_layers,
        num_attention_heads=shape.num_attention_heads,
        q_lora_rank=m.q_lora_rank,
        kv_lora_rank=m.kv_lora_rank,
        qk_nope_head_dim=m.qk_nope_head_dim,
        qk_rope_head_dim=m.qk_rope_head_dim,
        v_head_dim=m.v_head_dim,
        rms_norm_eps=shape.rms_norm_eps,
        max_position_embeddings=shape.max_position_embeddings,
        rope=rope,
    )


def _standard_layer_config(shape: DraftShape, vocab_size: int) -> Any:
    return config_class(DRAFT_LAYERS[shape.layer_type])(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        hidden_act="silu",
        max_position_embeddings=shape.max_position_embeddings,
        rms_norm_eps=shape.rms_norm_eps,
        tie_word_embeddings=False,
    )


def target_rope(verifier_dir: str | Path) -> dict[str, Any]:
    """The target's rope keys as its config.json spells them (nested text config read)."""
    from eagle3_pipeline.draft.mla import target_rope as pick

    config = read_json(Path(verifier_dir) / "config.json", "the target's config.json")
    return pick(split_text_config(config)[1])


def build_draft(
    spec: TargetSpec,
    shape: DraftShape,
    speculative_tokens: int,
    draft_vocab_size: int,
    d2t: Any,
    t2d: Any,
    verifier_dir: str | Path,
    attn_implementation: str,
    norm_before_residual: bool = True,
    options: DraftShapeConfig | None = None,
) -> Any:
    """A fresh ``Eagle3DraftModel`` with the target's frozen embeddings / lm_head / norm.

    The verifier is read from the local ``verifier_dir``; the config then carries
    ``spec.verifier_id`` (hub id, else the local path, which ``save_draft`` writes
    relative to the draft directory) for publication.
    ``options`` carries the EAGLE-3.1 switches (``norm_before_fc``, ``fc_norm``,
    ``norm_output``; all off when None), written to the config vLLM reads them from.
    """
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    n_aux = len(spec.aux_layer_ids)
    local = str(Path(verifier_dir).resolve())
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=transformer_layer_config(
            shape,
            spec.vocab_size,
            n_aux,
            attn_implementation,
            target_rope(verifier_dir) if shape.mla is not None else None,
        ),
        draft_vocab_size=draft_vocab_size,
        norm_before_residual=norm_before_residual,
        norm_before_fc=bool(options and norm_before_fc_on(options)),
        fc_norm=bool(options and options.fc_norm),
        norm_output=bool(options and options.norm_output),
        eagle_aux_hidden_state_layer_ids=list(spec.aux_layer_ids),
        target_hidden_size=spec.hidden_size,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=speculative_tokens)],
            default_proposal_method="greedy",
            verifier=VerifierConfig.from_pretrained(local),
        ),
    )
    model = Eagle3DraftModel(config=config)
    model.load_vocab_mappings(t2d, d2t)
    model.load_verifier_weights()
    config.speculators_config.verifier.name_or_path = published_verifier_id(spec, verifier_dir)
    return model


def published_verifier_id(spec: TargetSpec, verifier_dir: str | Path) -> str:
    """The hub id when the target has one, else the absolute local target path."""
    return spec.hub_id or str(Path(verifier_dir).resolve())
