"""The MLA draft on disk: the plain DeepSeek config vLLM serves, and back.

Why not speculators' format: vLLM reads a speculators EAGLE-3 config only with a llama or
qwen3 layer (``transformers_utils/configs/speculators/algos.py``). An MLA draft is served
by ``deepseek_eagle3.py`` (``Eagle3DeepseekV2ForCausalLM``) from a plain config: vLLM
prefixes the config's ``architectures`` with ``Eagle3`` and reads the DeepSeek attention
fields, ``draft_vocab_size``, ``target_hidden_size``, ``norm_before_residual``,
``fc_norm``, ``norm_output`` and ``eagle_aux_hidden_state_layer_ids`` from the top level.

Traps, each read from vLLM 0.32: ``model_type: deepseek_v3`` is rewritten to
``deepseek_mtp`` by ``SpeculativeConfig.hf_config_override`` and then does not resolve,
so the config says ``deepseek_v2`` (whose transformers config has the same fields); a
``speculators_config`` key would send vLLM down the speculators path, so what our
reload needs besides (the verifier, K) sits under :data:`PIPELINE_KEY`; a ``null`` for
an int field (``n_routed_experts``) fails transformers' strict config check, so only
the fields below are written. vLLM's MLA draft has no ``norm_before_fc``.

The weights are speculators' own names (``layers.0.self_attn.q_a_proj.weight``, ...),
which vLLM maps itself (``q_a_proj`` + ``kv_a_proj_with_mqa`` into ``fused_qkv_a_proj``,
whatever the config's ``q_lora_rank``: so an MLA draft always has one, see
``draft/shape.py``). vLLM's MLA draft drops no tensor it has no parameter for (no
``input_norm``, no ``mask_hidden``, no ``d2t`` when the draft vocabulary is the target's).
"""

from __future__ import annotations

from typing import Any

SERVED_ARCHITECTURE = "DeepseekV2ForCausalLM"  # vLLM serves Eagle3DeepseekV2ForCausalLM
SERVED_MODEL_TYPE = "deepseek_v2"
PIPELINE_KEY = "eagle3_pipeline"  # the verifier and K, for our reload (vLLM ignores it)

MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
LAYER_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    *MLA_FIELDS,
    "rms_norm_eps",
    "max_position_embeddings",
    "hidden_act",
    "vocab_size",
)


def is_served_mla(config: dict[str, Any]) -> bool:
    """A config.json in this format (rather than speculators')."""
    return "speculators_config" not in config and config.get("model_type") == SERVED_MODEL_TYPE


def rope_keys(layer_config: Any) -> dict[str, Any]:
    """transformers 5's ``rope_parameters`` in the spelling real DeepSeek / Kimi configs
    use and vLLM serves them with: ``rope_theta``, and ``rope_scaling`` unless plain."""
    params = dict(layer_config.rope_parameters or {})
    out: dict[str, Any] = {"rope_theta": float(params.pop("rope_theta", 10000.0))}
    if params.get("rope_type", params.get("type", "default")) != "default":
        out["rope_scaling"] = params
    return out


def served_config(
    model_config: Any, verifier: str | None, speculative_tokens: int
) -> dict[str, Any]:
    """The config.json vLLM serves for the ``Eagle3DraftModel`` config ``model_config``;
    ``verifier``: the published verifier name (hub id or a path relative to the draft)."""
    tlc = model_config.transformer_layer_config
    aux = list(model_config.eagle_aux_hidden_state_layer_ids)
    verifier_cfg = model_config.speculators_config.verifier
    config: dict[str, Any] = {
        "architectures": [SERVED_ARCHITECTURE],
        "model_type": SERVED_MODEL_TYPE,
        **{k: getattr(tlc, k) for k in LAYER_FIELDS},
        # vLLM's EAGLE-3 MLA layer is always a dense MLP; the field keeps transformers'
        # DeepSeek config from calling any layer MoE.
        "first_k_dense_replace": int(tlc.num_hidden_layers),
        **rope_keys(tlc),
        "draft_vocab_size": int(model_config.draft_vocab_size),
        "target_hidden_size": int(model_config.target_hidden_size or tlc.hidden_size),
        "norm_before_residual": bool(model_config.norm_before_residual),
        "fc_norm": bool(model_config.fc_norm),
        "norm_output": bool(model_config.norm_output),
        "eagle_aux_hidden_state_layer_ids": aux,
        "num_aux_hidden_states": len(aux),
        "tie_word_embeddings": False,
        "torch_dtype": str(getattr(model_config, "dtype", None) or "float32").removeprefix(
            "torch."
        ),
        PIPELINE_KEY: {
            "layer_type": "mla",
            "speculative_tokens": int(speculative_tokens),
            "verifier": {
                "name_or_path": verifier,
                "architectures": list(verifier_cfg.architectures or []),
            },
        },
    }
    return config


def speculators_config(config: dict[str, Any], verifier_dir: str, attn: str) -> Any:
    """An ``Eagle3SpeculatorConfig`` for a served MLA config, its verifier the local
    ``verifier_dir`` (the caller puts the published name back)."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    from eagle3_pipeline.draft import mla

    mla.register()
    rope = mla.target_rope(config)
    tlc = mla.layer_config(
        vocab_size=int(config["vocab_size"]),
        hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config["intermediate_size"]),
        num_layers=int(config["num_hidden_layers"]),
        num_attention_heads=int(config["num_attention_heads"]),
        q_lora_rank=config.get("q_lora_rank"),
        kv_lora_rank=int(config["kv_lora_rank"]),
        qk_nope_head_dim=int(config["qk_nope_head_dim"]),
        qk_rope_head_dim=int(config["qk_rope_head_dim"]),
        v_head_dim=int(config["v_head_dim"]),
        rms_norm_eps=float(config["rms_norm_eps"]),
        max_position_embeddings=int(config["max_position_embeddings"]),
        rope=rope,
    )
    tlc.num_aux_hidden_states = len(config["eagle_aux_hidden_state_layer_ids"])
    tlc._attn_implementation = attn
    ours = config.get(PIPELINE_KEY) or {}
    return Eagle3SpeculatorConfig(
        transformer_layer_config=tlc,
        draft_vocab_size=int(config["draft_vocab_size"]),
        norm_before_residual=bool(config.get("norm_before_residual", False)),
        norm_before_fc=False,
        fc_norm=bool(config.get("fc_norm", False)),
        norm_output=bool(config.get("norm_output", False)),
        eagle_aux_hidden_state_layer_ids=list(config["eagle_aux_hidden_state_layer_ids"]),
        target_hidden_size=config.get("target_hidden_size"),
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[
                GreedyTokenProposalConfig(speculative_tokens=int(ours.get("speculative_tokens", 3)))
            ],
            default_proposal_method="greedy",
            verifier=VerifierConfig.from_pretrained(verifier_dir),
        ),
    )
