"""Preflight's view of the training data: is the file there, and a fingerprint of it.

A local data file (``data.source=file``) lives wherever the user keeps it, often outside
the repository, so it cannot be a fixed DVC dependency of prepare (``data.path`` is a
param, and it is null for the built-in corpus). Without one, editing the file in place
would rerun nothing and the draft would train on data that no longer exists. So preflight,
which runs on every ``dvc repro``, writes ``paths.data_fingerprint`` -- the file's size
and SHA-256, read once and then remembered by path, size, mtime and inode under
``paths.cache`` -- and prepare depends on that small file.

A missing file is a config error found here, before the target is built; so is a file
whose SHA-256 is not ``data.pinned.sha256`` (:mod:`eagle3_pipeline.data.pinned`).
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

from eagle3_pipeline.data.pinned import PinnedFileError, data_file
from eagle3_pipeline.preflight.result import Check
from eagle3_pipeline.preflight.view import PreflightInputs


def check_data_file(cfg: PreflightInputs) -> tuple[Check, dict[str, Any]]:
    """The ``data`` check and what prepare's inputs are, as a fingerprint."""
    d = cfg.data
    source = str(d.source)
    if source == "builtin":  # generated from the Python install's pydoc topics
        return (
            Check("data", True, "built-in corpus"),
            {"source": source, "python": platform.python_version()},
        )
    if source != "file":
        return (
            Check("data", True, f"{source} dataset {d.path} (read by prepare)"),
            {"source": source, "path": d.path, "split": d.split},
        )
    path = Path(str(d.path))
    if not path.is_file() and d.pinned is None:
        return (
            Check(
                "data",
                False,
                "not found",
                [
                    f"data.path={d.path}: no such file; point data.path at a JSONL or JSON file of "
                    "conversations (or use data.source=builtin)"
                ],
            ),
            {"source": source, "path": str(d.path), "missing": True},
        )
    try:
        f = data_file(d, Path(cfg.paths.cache))
    except PinnedFileError as exc:
        return (
            Check("data", False, "not the pinned file", [str(exc)]),
            {"source": source, "path": str(d.path), "refused": True},
        )
    pinned = f", pinned {f.pinned}" if f.pinned else ""
    return (
        Check("data", True, f"{path}: {f.size:,} bytes, sha256 {f.sha256[:12]}{pinned}"),
        {"source": source, "path": str(path.resolve()), "size": f.size, "sha256": f.sha256},
    )
