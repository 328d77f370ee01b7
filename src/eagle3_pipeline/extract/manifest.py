"""The manifest and the existing files: what a rerun may reuse.

Files of different targets, revisions, layers, dtypes or rows must never be mixed in one
directory (the trainer would read them as one dataset without noticing). The manifest
records everything that makes two files incompatible; a run only adds files to a
directory whose manifest carries exactly its key, and only reuses files that are complete.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config import ConfigError
from eagle3_pipeline.core.errors import StageError
from eagle3_pipeline.core.records import RecordError
from eagle3_pipeline.core.safetensors import read_header
from eagle3_pipeline.extract.fingerprint import weights_fingerprint
from eagle3_pipeline.extract.layout import FILE_RE, FORMAT, MANIFEST, TMP_GLOB
from eagle3_pipeline.extract.record import ExtractManifest
from eagle3_pipeline.extract.rows import Rows
from eagle3_pipeline.targets.adapter import TargetSpec

log = logging.getLogger(__name__)

_SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def manifest_key(
    spec: TargetSpec, model_dir: Path, dtype: str, backend: str, tok_sha: str
) -> dict[str, Any]:
    """Everything that makes two hidden-state files incompatible. Files are only ever
    added to a directory whose manifest carries exactly this key."""
    pinned = bool(spec.hub_id and spec.revision)
    return {
        "format": FORMAT,
        "backend": backend,
        "target": {
            "name": spec.name,
            "hub_id": spec.hub_id,
            "revision": spec.revision,
            "architecture": spec.architecture,
            "num_layers": spec.num_layers,
            "hidden_size": spec.hidden_size,
            "vocab_size": spec.vocab_size,
            "weights": None if pinned else weights_fingerprint(model_dir),
        },
        "tokenizer_sha256": tok_sha,
        "layers": {
            "aux_layer_ids": list(spec.aux_layer_ids),
            "final": "before_final_norm",
            "layout": "hidden_states[:, :n_aux] = aux layers in order; [:, -1] = final",
        },
        "hidden_size": spec.hidden_size,
        "dtype": dtype,
    }


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [f"{prefix.rstrip('.')}: {a!r} (files) != {b!r} (now)"]


def existing_files(out: Path) -> dict[int, Path]:
    found: dict[int, Path] = {}
    if out.is_dir():
        for f in out.iterdir():
            m = FILE_RE.match(f.name)
            if m:
                found[int(m.group(1))] = f
    return found


def _manifest_problems(mpath: Path, key: dict[str, Any], rows: Rows) -> list[str]:
    """Why the files under an existing manifest cannot be reused for ``key`` and ``rows``
    (a manifest of another schema version among them: nothing says what its files hold)."""
    try:
        old = ExtractManifest.read(mpath)
    except RecordError as exc:
        return [f"{MANIFEST}: {exc.problem}"]
    problems = _diff({k: getattr(old, k) for k in key}, key)
    samples = old.samples
    n_old = int(samples.get("count", 0))
    if not problems and 0 < n_old <= len(rows):
        if rows.prefix_sha256.get(n_old) != samples.get("input_ids_sha256"):
            problems.append(
                f"samples: rows 0..{n_old - 1} differ from the {n_old} rows the files were "
                f"extracted from (input_ids hash)"
            )
    return problems


def check_manifest(out: Path, key: dict[str, Any], rows: Rows, on_mismatch: str) -> dict[int, Path]:
    """Decide what existing files may be reused; refuse (or, with
    ``on_mismatch=restart``, delete) files of another target/revision/layers/dtype or of
    rows that are neither a prefix nor an extension of these. Returns the reusable files."""
    files = existing_files(out)
    mpath = out / MANIFEST
    problems: list[str] = []
    if mpath.is_file():
        problems = _manifest_problems(mpath, key, rows)
    elif files:
        problems.append(f"{len(files)} hs_*.safetensors files but no {MANIFEST}")
    if not problems:
        return files
    if on_mismatch == "restart":
        log.warning("%s: discarding %d files: %s", out, len(files), "; ".join(problems))
        for f in files.values():
            f.unlink()
        mpath.unlink(missing_ok=True)
        return {}
    raise StageError(
        f"{out}: existing hidden states do not match this extraction ({'; '.join(problems)}); "
        f"files are never mixed: remove {out} or set extract.on_mismatch=restart"
    )


def write_manifest(
    out: Path,
    key: dict[str, Any],
    rows: Rows,
    plan: dict[str, Any],
    online: dict[str, Any] | None = None,
) -> ExtractManifest:
    """Deterministic content (no timestamps): every rank writes the same bytes. ``online``:
    the engine the train stage starts (extract.mode=online, no files)."""
    manifest = ExtractManifest(
        **key,
        samples={"count": len(rows), "tokens": rows.tokens, "input_ids_sha256": rows.sha256},
        plan=plan,
        mode="offline" if online is None else "online",
        online=online,
    )
    manifest.write(out / MANIFEST)
    return manifest


def manifest_count(out: Path) -> int:
    """How many rows the existing files were extracted from (0 when unknown)."""
    with contextlib.suppress(RecordError, TypeError, ValueError):
        return int(ExtractManifest.read(out / MANIFEST).samples["count"])
    return 0


def file_matches(path: Path, length: int, n_layers: int, hidden: int, dtype: str) -> bool:
    """A cheap header check (no tensor data read) that an existing file is complete and of
    the expected shape; anything else is redone."""
    try:
        header = read_header(path)  # refuses a file shorter or longer than its header says
    except ConfigError:
        return False
    tok, hs = header.get("token_ids"), header.get("hidden_states")
    return (
        tok is not None
        and hs is not None
        and tok.dtype == "I64"
        and tok.shape == (length,)
        and hs.shape == (length, n_layers, hidden)
        and _SAFETENSORS_DTYPES.get(hs.dtype) == dtype
    )


def verify_token_ids(rows: Rows, files: dict[int, Path]) -> None:
    """Each reusable file's ``token_ids`` must be its row's ``input_ids`` (reads only that
    small tensor)."""
    import numpy as np
    from safetensors import safe_open

    for i in sorted(k for k in files if k < len(rows)):
        try:
            with safe_open(str(files[i]), framework="numpy") as fh:
                tok = fh.get_tensor("token_ids")
        except Exception:  # unreadable: it will be redone
            continue
        if not np.array_equal(tok, rows.input_ids([i])[0]):
            raise StageError(
                f"{files[i]}: token_ids differ from row {i} of {rows.path}: the files come from "
                f"other rows; remove them or set extract.on_mismatch=restart"
            )


def remove_stale_temps(out: Path) -> int:
    """Temp files of a killed run (a hard kill runs no cleanup)."""
    n = 0
    for f in out.glob(TMP_GLOB):
        f.unlink(missing_ok=True)
        n += 1
    return n
