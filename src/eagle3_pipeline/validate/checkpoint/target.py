"""The target rules: was this draft trained for this target, on the layers vLLM will tap?

A draft for another target (width, vocabulary, layer count) or one whose aux ids differ
from the extraction's loads in vLLM and then proposes garbage, so it is caught here. The
verifier id decides whether ``vllm serve DRAFT`` alone can find the target; the serve
command printed with the report does not depend on it.
"""

from __future__ import annotations

import re
from pathlib import Path

from eagle3_pipeline.core.portable import portable
from eagle3_pipeline.targets.adapter import VLLM_EAGLE3_TARGETS, TargetSpec
from eagle3_pipeline.validate.checkpoint.config import AUX_WHERE, CheckpointShape
from eagle3_pipeline.validate.checkpoint.report import Report

VERIFIER_WHERE = "config.json:speculators_config.verifier.name_or_path"


def check_against_target(
    report: Report,
    shape: CheckpointShape | None,
    spec: TargetSpec,
    expected_aux_ids: list[int] | None,
) -> None:
    """Was this draft trained for this target, on the layers the hidden states came from?"""
    _check_architecture(report, spec)
    if shape is not None:
        _check_dimensions(report, shape, spec)
    aux = report.facts.get("aux_layer_ids")
    if aux:
        want = list(expected_aux_ids) if expected_aux_ids is not None else list(spec.aux_layer_ids)
        _check_aux_ids(report, list(aux), spec.num_layers, want)
    name = report.facts.get("verifier_name_or_path")
    _check_verifier_id(report, name, spec.hub_id)
    target_ref = spec.hub_id or spec.path or name
    k = report.facts.get("speculative_tokens")
    if target_ref and k:
        report.serve_command = serve_command(target_ref, report.draft_dir, k)


def check_without_target(report: Report, expected_aux_ids: list[int] | None) -> None:
    """What can be said with no target: the extraction's aux ids and a hub-servable id."""
    name = report.facts.get("verifier_name_or_path")
    aux = report.facts.get("aux_layer_ids")
    if expected_aux_ids is not None and aux is not None and list(aux) != list(expected_aux_ids):
        report.error(
            "aux-ids-mismatch",
            AUX_WHERE,
            f"{aux} != extraction ids {list(expected_aux_ids)}",
        )
    if name and _looks_local(name):
        report.warning(
            "verifier-id",
            VERIFIER_WHERE,
            f"{name!r} looks like a local path: `vllm serve DRAFT` needs a hub id there; "
            "serve with --speculative-config instead",
        )
    report.info("target-skipped", "target.json", "no target given: target checks not run")
    k = report.facts.get("speculative_tokens")
    if name and k:
        report.serve_command = serve_command(name, report.draft_dir, k)


def _check_architecture(report: Report, spec: TargetSpec) -> None:
    where = "target.json:vllm_architecture"
    if spec.vllm_architecture not in VLLM_EAGLE3_TARGETS:
        report.error(
            "target-arch",
            where,
            f"{spec.vllm_architecture!r} (transformers: {spec.architecture}) is not a vLLM "
            "EAGLE-3 target: vLLM cannot hand it aux hidden states",
        )
    elif spec.vllm_architecture != spec.architecture:
        report.info(
            "target-arch",
            where,
            f"vLLM registers {spec.architecture} as {spec.vllm_architecture}",
        )


def _check_dimensions(report: Report, shape: CheckpointShape, spec: TargetSpec) -> None:
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


def _check_aux_ids(report: Report, aux: list[int], num_layers: int, want: list[int]) -> None:
    """Ids must be target layers (``num_layers`` is the final hidden state) and the ones
    the hidden states were extracted at."""
    out = [a for a in aux if a < 0 or a > num_layers]
    if out:
        report.error(
            "aux-ids-range",
            AUX_WHERE,
            f"{out} outside [0, {num_layers - 1}] for a {num_layers}-layer target",
        )
    elif num_layers in aux:
        report.warning(
            "aux-ids-range",
            AUX_WHERE,
            f"id {num_layers} is the target's final hidden state: only vLLM versions "
            "whose target backbone returns it can serve this draft",
        )
    if aux != want:
        report.error(
            "aux-ids-mismatch",
            AUX_WHERE,
            f"{aux} != {want}, the layers the hidden states were extracted at: vLLM "
            "would feed the draft other layers than it was trained on",
        )


def _check_verifier_id(report: Report, name: str | None, hub_id: str | None) -> None:
    """A published target needs its hub id in the draft; a local one cannot have it."""
    if name is None:
        return
    if hub_id:
        if name != hub_id:
            report.error(
                "verifier-id",
                VERIFIER_WHERE,
                f"{name!r}, expected the target's hub id {hub_id!r}: a published draft must "
                "name its target so `vllm serve DRAFT` and speculators can find it",
            )
    elif not _looks_local(name):
        report.warning(
            "verifier-id",
            VERIFIER_WHERE,
            f"{name!r} looks like a hub id, but target.json records none: `vllm serve DRAFT` "
            "would fetch that model; serve with --speculative-config (below)",
        )
    else:
        report.info(
            "verifier-id",
            VERIFIER_WHERE,
            f"{name!r}: a local target; serve with an explicit --speculative-config (below)",
        )


def serve_command(target: str, draft_dir: str, k: int) -> str:
    """The ``vllm serve`` line that loads this draft without relying on name_or_path (the
    validate stage's engines add dtype, parallel sizes and workarounds to it)."""
    from eagle3_pipeline.serving.engine import eagle3_config, vllm_json

    spec = vllm_json(eagle3_config(Path(draft_dir).resolve(), k))
    return portable(f"vllm serve {target} --speculative-config '{spec}'")


def _looks_local(name: str) -> bool:
    return (
        name.startswith(("/", "./", "../", "~"))
        or Path(name).exists()
        or not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", name)
    )
