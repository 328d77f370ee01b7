"""The free-disk check: room for the hidden states, one checkpoint and a margin.

Why here and not at extraction: extraction fills the disk hours into a run; the plan's
storage estimate (:mod:`eagle3_pipeline.plan.resources`) can say so before anything starts.
"""

from __future__ import annotations

from eagle3_pipeline.core.errors import ConfigError
from eagle3_pipeline.plan.resources import (
    FreeBytesFn,
    disk_need,
    estimate_draft,
    estimate_storage,
)
from eagle3_pipeline.plan.target_info import load_target
from eagle3_pipeline.plan.units import fmt_gb
from eagle3_pipeline.preflight.record import DiskReading, DiskUnknown
from eagle3_pipeline.preflight.result import Check
from eagle3_pipeline.preflight.view import PreflightInputs


def check_disk(
    cfg: PreflightInputs, free_fn: FreeBytesFn
) -> tuple[Check, DiskReading | DiskUnknown]:
    """Free space vs hidden states + checkpoint + margin (the plan's numbers)."""
    where = cfg.preflight.disk_path or cfg.data_dir
    try:
        target = load_target(cfg.model)
        storage = estimate_storage(cfg, target)
        need = disk_need(cfg, storage, estimate_draft(cfg, target), free_fn, path=where)
    except ConfigError as exc:
        return (
            Check("disk", False, "cannot estimate", [f"disk: cannot estimate the need: {exc}"]),
            DiskUnknown(path=str(where), error=str(exc)),
        )
    reading = (
        f"{fmt_gb(need.free_bytes)} free under {need.path}/, need {fmt_gb(need.need_bytes)} "
        f"(hidden states {fmt_gb(need.hidden_states_bytes)}"
        f"{' upper bound' if need.upper_bound else ''} + checkpoint "
        f"{fmt_gb(need.checkpoint_bytes)} + margin {fmt_gb(need.margin_bytes)})"
    )
    problem = need.problem()
    info = DiskReading(
        path=need.path,
        hidden_states_bytes=need.hidden_states_bytes,
        checkpoint_bytes=need.checkpoint_bytes,
        margin_bytes=need.margin_bytes,
        need_bytes=need.need_bytes,
        free_bytes=need.free_bytes,
        upper_bound=need.upper_bound,
        fits=need.fits,
        bytes_per_token=storage.bytes_per_token,
        total_tokens=storage.total_tokens,
        basis=storage.basis,
    )
    return Check("disk", problem is None, reading, [problem] if problem else []), info
