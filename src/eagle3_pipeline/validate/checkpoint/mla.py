"""The ``config.json`` rules of an MLA EAGLE-3 draft, served by vLLM's ``deepseek_eagle3.py``
from a plain DeepSeek config (``draft/mla_format.py`` writes it; read from vLLM 0.32).

The traps: ``architectures`` must name a class vLLM prefixes to
``Eagle3DeepseekV2ForCausalLM`` (or name that class); ``model_type: deepseek_v3`` is
rewritten to ``deepseek_mtp`` and does not resolve; without
``eagle_aux_hidden_state_layer_ids`` vLLM taps the target's default layers, and without
``num_aux_hidden_states`` it sizes ``fc`` for 3 of them; vLLM defaults
``norm_before_residual`` to False; a ``norm_before_fc`` is ignored (no such norm there);
``q_lora_rank: null`` cannot load (``kv_a_proj_with_mqa`` is always renamed into the
``fused_qkv_a_proj`` that only a q_lora_rank builds).
"""

from __future__ import annotations

from typing import Any

from eagle3_pipeline.draft.mla_format import MLA_FIELDS, PIPELINE_KEY, SERVED_ARCHITECTURE
from eagle3_pipeline.targets.adapter import MlaDims
from eagle3_pipeline.validate.checkpoint.config import (
    CheckpointShape,
    check_aux_count,
    check_aux_ids,
    check_draft_vocab,
    check_flags,
    check_norm_before_residual,
    check_target_hidden,
    is_int,
    require_field,
)
from eagle3_pipeline.validate.checkpoint.report import Report

# What vLLM turns into its MLA EAGLE-3 class (it prefixes "Eagle3" to the rest).
SERVED_ARCHITECTURES = {
    SERVED_ARCHITECTURE,
    "DeepseekV3ForCausalLM",
    "Eagle3DeepseekV2ForCausalLM",
    "Eagle3DeepseekV3ForCausalLM",
}
SERVED_MODEL_TYPES = ("deepseek_v2", "kimi_k2")


def is_plain_mla(config: dict[str, Any]) -> bool:
    """A draft config in vLLM's plain MLA format rather than speculators'."""
    return "speculators_config" not in config and "kv_lora_rank" in config


def check_mla_config(report: Report, config: dict[str, Any]) -> CheckpointShape | None:
    """The rules; the expected tensor shapes when the config defines them."""
    _check_served_as(report, config)
    check_norm_before_residual(report, config)
    draft_vocab = check_draft_vocab(report, config)
    check_flags(report, config)
    if config.get("norm_before_fc") is True:
        report.error(
            "mla-option",
            "config.json:norm_before_fc",
            "vLLM's MLA draft has no norm before fc: it would be dropped at serve time",
        )
    aux = check_aux_ids(report, config)
    n_aux = check_aux_count(report, config, aux, where="")
    dims = {
        key: require_field(report, config, src, src, "int")
        for key, src in (
            ("hidden", "hidden_size"),
            ("layers", "num_hidden_layers"),
            ("heads", "num_attention_heads"),
            ("intermediate", "intermediate_size"),
            ("vocab", "vocab_size"),
        )
    }
    require_field(report, config, "rms_norm_eps", "rms_norm_eps", "number")
    mla = _mla_dims(report, config)
    target_hidden = check_target_hidden(report, config, dims["hidden"])
    k = (config.get(PIPELINE_KEY) or {}).get("speculative_tokens")
    report.facts["speculative_tokens"] = k if is_int(k) else None
    verifier = ((config.get(PIPELINE_KEY) or {}).get("verifier") or {}).get("name_or_path")
    report.facts["verifier_name_or_path"] = verifier if isinstance(verifier, str) else None
    if any(v is None for v in dims.values()) or mla is None or draft_vocab is None:
        return None
    if target_hidden is None or aux is None:
        return None
    qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    return CheckpointShape(
        **dims,
        kv_heads=dims["heads"],
        head_dim=qk,
        target_hidden=target_hidden,
        draft_vocab=draft_vocab,
        n_aux=n_aux,
        layer_type="mla",
        fc_norm=config.get("fc_norm") is True,
        mla=mla,
    )


def _check_served_as(report: Report, config: dict[str, Any]) -> None:
    archs = config.get("architectures")
    if not isinstance(archs, list) or not any(a in SERVED_ARCHITECTURES for a in archs):
        report.error(
            "vllm-detection",
            "config.json:architectures",
            f"{archs!r}: vLLM serves an MLA EAGLE-3 draft only as {SERVED_ARCHITECTURE} "
            "(Eagle3DeepseekV2ForCausalLM)",
        )
    model_type = config.get("model_type")
    if model_type == "deepseek_v3":
        report.error(
            "model-type",
            "config.json:model_type",
            "deepseek_v3: vLLM rewrites it to deepseek_mtp and then cannot resolve the "
            f"draft; write one of {', '.join(SERVED_MODEL_TYPES)}",
        )
    elif model_type not in SERVED_MODEL_TYPES:
        report.error(
            "model-type",
            "config.json:model_type",
            f"{model_type!r}: expected one of {', '.join(SERVED_MODEL_TYPES)}",
        )


def _mla_dims(report: Report, config: dict[str, Any]) -> MlaDims | None:
    q_lora = config.get("q_lora_rank")  # null: one q projection, no low rank
    if q_lora is not None:
        q_lora = require_field(report, config, "q_lora_rank", "q_lora_rank", "int")
    else:
        report.error(
            "mla-q-lora",
            "config.json:q_lora_rank",
            f"{q_lora!r}: vLLM's deepseek_eagle3 loads kv_a_proj_with_mqa into "
            "fused_qkv_a_proj, which DeepseekV2MLAAttention builds only with a q_lora_rank, "
            "so the load fails; an MLA draft needs a query low rank (this pipeline gives "
            "one to every MLA draft)",
        )
    kv, nope, rope, v = (require_field(report, config, key, key, "int") for key in MLA_FIELDS[1:])
    if None in (kv, nope, rope, v) or (config.get("q_lora_rank") is not None and q_lora is None):
        return None
    return MlaDims(
        q_lora_rank=q_lora,
        kv_lora_rank=kv,
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        v_head_dim=v,
    )
