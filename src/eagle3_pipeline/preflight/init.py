"""Preflight's view of ``train.init_from``: is the warm-start source there, in a format we
read, and what is its content (``paths.init_fingerprint``, which train depends on in
``dvc.yaml``: a source changed in place reruns train, then validate on the new draft, and
nothing upstream of train). Whether its layout fits the run is checked by train's plan,
against the target and the prepared vocabulary."""

from __future__ import annotations

from typing import Any

from eagle3_pipeline.core.errors import ConfigError
from eagle3_pipeline.preflight.result import Check
from eagle3_pipeline.preflight.view import PreflightInputs
from eagle3_pipeline.train.warm_start import describe


def check_init_source(cfg: PreflightInputs) -> tuple[Check | None, dict[str, Any]]:
    """The ``init_from`` check (None without a warm start) and the fingerprint to write."""
    path = cfg.train.init_from
    if not path:
        return None, {"init_from": None}
    try:
        source = describe(path)
    except ConfigError as exc:
        return Check("init_from", False, "unusable", [str(exc)]), {
            "init_from": path,
            "refused": True,
        }
    reading = f"{path}: {source.format} draft, sha256 {source.sha256[:12]}"
    return Check("init_from", True, reading), {
        "init_from": path,
        "format": source.format,
        "sha256": source.sha256,
    }
