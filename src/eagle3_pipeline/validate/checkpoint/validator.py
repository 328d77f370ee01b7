"""Will vLLM and speculators load this EAGLE-3 draft correctly? Checked without either.

Why this exists: a draft that breaks vLLM's loading rules fails at serve time, on a GPU,
long after training -- or worse, it loads: vLLM leaves a tensor missing from the
checkpoint uninitialised without a word, serves the draft on the target's default aux
layers when ``eagle_aux_hidden_state_layer_ids`` is absent, sizes ``fc`` for 3 aux layers
unless told otherwise, and defaults ``norm_before_residual`` to the opposite of
speculators. Every such trap is a rule, read from vLLM's
``transformers_utils/configs/speculators`` and ``model_executor/models/llama_eagle3.py``.

The rules live by what they read, one module each in this package: ``config``
(config.json), ``weights`` (safetensors headers: names, shapes, dtypes), ``values``
(NaN/Inf and ``d2t``, one tensor at a time), ``target`` (the target it was trained for),
``mla`` (Kimi's MLA draft layer) and ``reload`` (speculators itself, imported lazily). All
but the reload work without vLLM, without a GPU and without importing speculators; this
module runs them in order into one :class:`~.report.Report`.

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

import json
from pathlib import Path
from typing import Any

from eagle3_pipeline.targets.adapter import TargetSpec
from eagle3_pipeline.validate.checkpoint.config import CheckpointShape, check_config
from eagle3_pipeline.validate.checkpoint.mla import check_mla_config, is_plain_mla
from eagle3_pipeline.validate.checkpoint.reload import check_reload
from eagle3_pipeline.validate.checkpoint.report import ERROR, INFO, WARNING, Finding, Report
from eagle3_pipeline.validate.checkpoint.target import (
    check_against_target,
    check_without_target,
    serve_command,
)
from eagle3_pipeline.validate.checkpoint.values import check_tensor_values
from eagle3_pipeline.validate.checkpoint.weights import (
    StoredTensor,
    check_weights,
    expected_tensors,
    read_weight_headers,
    vllm_name,
)

__all__ = [
    "ERROR",
    "INFO",
    "WARNING",
    "CheckpointShape",
    "Finding",
    "Report",
    "StoredTensor",
    "check_against_target",
    "check_config",
    "check_reload",
    "check_tensor_values",
    "check_weights",
    "expected_tensors",
    "read_weight_headers",
    "serve_command",
    "validate_checkpoint",
    "vllm_name",
]


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
    config = _read_config(report, draft_dir / "config.json")
    if config is None:
        return report

    # an MLA draft is served from a plain DeepSeek config, the others from speculators'
    shape = (
        check_mla_config(report, config) if is_plain_mla(config) else check_config(report, config)
    )
    config_errors = bool(report.errors)
    tensors = read_weight_headers(report, draft_dir)
    if tensors is not None:
        by_vllm = check_weights(report, tensors, shape)
        target_vocab = target_spec.vocab_size if target_spec else (shape.vocab if shape else None)
        check_tensor_values(report, draft_dir, by_vllm, target_vocab)

    if target_spec is not None:
        check_against_target(report, shape, target_spec, expected_aux_ids)
    else:
        check_without_target(report, expected_aux_ids)

    if reload and config_errors:  # speculators' refusal would only repeat them
        report.info("reload-skipped", "config.json", "config errors above: reload not tried")
    elif reload:
        check_reload(report, draft_dir, _verifier_dir(report, target_spec, verifier_dir))
    return report


def _read_config(report: Report, config_path: Path) -> dict[str, Any] | None:
    """config.json as a dict, or ``None`` after reporting why every rule is moot."""
    if not config_path.is_file():
        report.error("config-missing", str(config_path), "not found")
        return None
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        report.error("config-missing", str(config_path), f"not valid JSON ({exc})")
        return None
    if not isinstance(config, dict):
        report.error("config-missing", str(config_path), "must be a JSON object")
        return None
    return config


def _verifier_dir(
    report: Report, spec: TargetSpec | None, explicit: str | Path | None
) -> Path | None:
    """The first local target directory: explicit, target.json's path, the config's name."""
    candidates = [explicit, spec.path if spec else None, report.facts.get("verifier_name_or_path")]
    for cand in candidates:
        if not cand:
            continue
        # a published draft names a local target relative to itself (``../target/model``)
        for path in (Path(cand), Path(report.draft_dir) / cand):
            if (path / "config.json").is_file():
                return path
    return None
