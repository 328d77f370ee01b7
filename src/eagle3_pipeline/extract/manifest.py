"""The manifest and the existing files: what a rerun may reuse.

Files of different targets, revisions, layers, dtypes or rows must never be mixed in one
directory (the trainer would read them as one dataset without noticing). The manifest
records everything that makes two files incompatible; a run only adds files to a
directory whose manifest carries exactly its key, and only reuses files that are complete.

Which rows the files hold is proven file by file: the manifest records, for every
``hs_{i}.safetensors``, the hash of the row it holds (``row_sha256``). A file is reused
only when that hash is the hash of the current row i -- so an extension reuses every old
file, a shrink to a true prefix reuses the prefix, and rows that changed are redone
(``extract.on_mismatch=restart``) or refused (``refuse``), whatever the counts. A
manifest written before those hashes proves only an extension (its prefix hash).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config import ConfigError
from eagle3_pipeline.core.errors import StageError
from eagle3_pipeline.core.records import RecordError
from eagle3_pipeline.core.safetensors import read_header
from eagle3_pipeline.extract.fingerprint import weights_fingerprint
from eagle3_pipeline.extract.layout import FILE_RE, FORMAT, MANIFEST, TMP_GLOB
from eagle3_pipeline.extract.record import (
    ExtractManifest,
    ExtractPlan,
    ManifestLayers,
    ManifestSamples,
    ManifestTarget,
    OnlineSection,
)
from eagle3_pipeline.extract.rows import CHUNK_ROWS, Rows, _row_bytes
from eagle3_pipeline.targets.adapter import TargetSpec

log = logging.getLogger(__name__)

_SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
# Hex digits kept of each row's sha256 in the manifest: 128 bits leave no accidental
# collision within reach of any dataset while the manifest stays ~40 bytes a row.
ROW_HASH_HEX = 32
# The last rows hashed and their hashes: check_manifest and write_manifest of one run
# share one pass over the arrow data (Rows is never changed after load_rows).
_hashed: list[tuple[Rows, list[str]]] = []


def manifest_key(
    spec: TargetSpec, model_dir: Path, dtype: str, backend: str, tok_sha: str, compute_dtype: str
) -> dict[str, Any]:
    """Everything that makes two hidden-state files incompatible. Files are only ever
    added to a directory whose manifest carries exactly this key (``dtype``: the stored
    states'; ``compute_dtype``: the target's, which changes their values)."""
    pinned = bool(spec.hub_id and spec.revision)
    return {
        "format": FORMAT,
        "backend": backend,
        "target": ManifestTarget(
            name=spec.name,
            hub_id=spec.hub_id,
            revision=spec.revision,
            architecture=spec.architecture,
            num_layers=spec.num_layers,
            hidden_size=spec.hidden_size,
            vocab_size=spec.vocab_size,
            weights=None if pinned else weights_fingerprint(model_dir),
        ),
        "tokenizer_sha256": tok_sha,
        "layers": ManifestLayers(
            aux_layer_ids=list(spec.aux_layer_ids),
            final="before_final_norm",
            layout="hidden_states[:, :n_aux] = aux layers in order; [:, -1] = final",
        ),
        "hidden_size": spec.hidden_size,
        "dtype": dtype,
        "compute_dtype": compute_dtype,
    }


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if is_dataclass(a) and is_dataclass(b) and not isinstance(a, type):
        a, b = asdict(a), asdict(b)  # type: ignore[arg-type]
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


def row_hashes(rows: Rows) -> list[str]:
    """Each row's hash, as the manifest records it per file: sha256 of the bytes
    :mod:`~.rows` hashes a row by (its length, then its int64 ids), cut to
    :data:`ROW_HASH_HEX` digits. Computed once per :class:`Rows`."""
    if _hashed and _hashed[0][0] is rows:
        return _hashed[0][1]
    out: list[str] = []
    for start in range(0, len(rows), CHUNK_ROWS):
        for ids in rows.dataset[start : start + CHUNK_ROWS]["input_ids"]:
            out.append(hashlib.sha256(_row_bytes(ids)).hexdigest()[:ROW_HASH_HEX])
    _hashed[:] = [(rows, out)]
    return out


def _spans(indices: Iterable[int], limit: int = 6) -> str:
    """``0..3, 7, 9..12``: indices as runs, the first ``limit`` runs (the log stays one
    readable line however many files there are)."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = [f"{a}" if a == b else f"{a}..{b}" for a, b in runs[:limit]]
    return ", ".join(text) + (", ..." if len(runs) > limit else "")


@dataclass
class _Verdict:
    """What :func:`check_manifest` found: the files that may be reused, the ones that
    may not (and why), and whether the manifest itself describes none of them."""

    keep: dict[int, Path] = field(default_factory=dict)
    drop: dict[int, Path] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    whole: bool = False  # the manifest is unreadable or of another key: drop it too


def _malformed(old: ExtractManifest) -> list[str]:
    """What in a manifest of the right schema and types (the record's reader checked
    both) still cannot be read as a proof: a negative row count."""
    problems: list[str] = []
    count = old.samples.count
    if count < 0:
        problems.append(f"{MANIFEST}: samples.count={count!r} is not a row count")
    return problems


def _verdict_by_file(
    files: dict[int, Path], hashes: list[str], rows: Rows, verdict: _Verdict
) -> None:
    """Per-file proof: file i is reused when its recorded row hash is row i's; past the
    rows, a file is kept when a hash vouches for it (rows that grow back reuse it)."""
    mine = row_hashes(rows) if any(i < len(rows) for i in files) else []
    changed: list[int] = []
    unvouched: list[int] = []
    for i, f in files.items():
        if i >= len(hashes):
            unvouched.append(i)
        elif i < len(rows) and hashes[i] != mine[i]:
            changed.append(i)
        else:
            verdict.keep[i] = f
    if changed:
        verdict.problems.append(
            f"rows {_spans(changed)} differ from the rows their files hold, per "
            f"{MANIFEST}'s row_sha256"
        )
    if unvouched:
        verdict.problems.append(f"files {_spans(unvouched)} have no row hash in {MANIFEST}")
    for i in changed + unvouched:
        verdict.drop[i] = files[i]


def _verdict_by_prefix(
    files: dict[int, Path], old: ExtractManifest, rows: Rows, verdict: _Verdict
) -> None:
    """A manifest without per-file hashes proves only an extension: the current rows'
    first ``count`` rows hash to its ``input_ids_sha256``; then its files past ``count``
    are unproven. Anything else is redone (only existing files make a mismatch: with none,
    there is nothing to refuse)."""
    samples = old.samples
    n_old = samples.count
    if n_old > len(rows):
        problem = (
            f"{len(rows)} rows, fewer than the {n_old} the files were extracted from, and "
            f"{MANIFEST} has no row_sha256 to prove them a prefix of those"
        )
    elif n_old > 0 and rows.prefix_sha256.get(n_old) != samples.input_ids_sha256:
        problem = (
            f"rows 0..{n_old - 1} differ from the {n_old} rows the files were "
            f"extracted from (input_ids hash)"
        )
    else:
        verdict.keep = {i: f for i, f in files.items() if i < n_old}
        verdict.drop = {i: f for i, f in files.items() if i >= n_old}
        problem = f"files {_spans(verdict.drop)} lie beyond the {n_old} rows {MANIFEST} records"
        if verdict.drop:
            verdict.problems.append(problem)
        return
    verdict.drop = dict(files)
    if files:
        verdict.problems.append(problem)


def _verdict(out: Path, key: dict[str, Any], rows: Rows) -> _Verdict:
    """Which existing files the manifest proves to be these rows' states under ``key``.
    A manifest of another schema version or key proves nothing (nothing says what its
    files hold): every file goes, and the manifest with them."""
    files = existing_files(out)
    mpath = out / MANIFEST
    if not mpath.is_file():
        orphans = [f"{len(files)} hs_*.safetensors files but no {MANIFEST}"] if files else []
        return _Verdict(drop=files, problems=orphans)
    try:
        old = ExtractManifest.read(mpath)
    except RecordError as exc:
        return _Verdict(drop=files, problems=[f"{MANIFEST}: {exc.problem}"], whole=True)
    problems = _diff({k: getattr(old, k) for k in key}, key) + _malformed(old)
    if problems:
        return _Verdict(drop=files, problems=problems, whole=True)
    verdict = _Verdict()
    if old.row_sha256 is None:
        _verdict_by_prefix(files, old, rows, verdict)
    else:
        _verdict_by_file(files, old.row_sha256, rows, verdict)
    return verdict


def check_manifest(out: Path, key: dict[str, Any], rows: Rows, on_mismatch: str) -> dict[int, Path]:
    """Decide what existing files may be reused: those the manifest proves to hold these
    rows' states under ``key``. Any other file -- of another target/revision/layers/dtype,
    of rows that changed, unprovable -- is a mismatch: refused, or with
    ``on_mismatch=restart`` deleted (one warning line: how many and why) and redone.
    Returns the reusable files."""
    verdict = _verdict(out, key, rows)
    if not verdict.problems:
        return verdict.keep
    why = "; ".join(verdict.problems)
    if on_mismatch == "restart":
        log.warning(
            "%s: discarding %d of %d hidden-state files, redone (extract.on_mismatch=restart): %s",
            out,
            len(verdict.drop),
            len(verdict.drop) + len(verdict.keep),
            why,
        )
        for f in verdict.drop.values():
            f.unlink(missing_ok=True)  # another rank may have removed it first
        if verdict.whole:
            (out / MANIFEST).unlink(missing_ok=True)
        return verdict.keep
    raise StageError(
        f"{out}: existing hidden states do not match this extraction ({why}); "
        f"files are never mixed: remove {out} or set extract.on_mismatch=restart"
    )


def _carried_hashes(mpath: Path, key: dict[str, Any], n_rows: int) -> list[str]:
    """The row hashes of the existing manifest past the current rows: the files of a
    longer row set that a shrink to a prefix kept stay provable, so rows that grow back
    reuse them. Only from a manifest of the same key (check_manifest removed any other)."""
    with contextlib.suppress(RecordError):
        old = ExtractManifest.read(mpath)
        same = {k: getattr(old, k) for k in key} == key
        if same and old.row_sha256 is not None and not _malformed(old):
            return old.row_sha256[n_rows:]
    return []


def write_manifest(
    out: Path,
    key: dict[str, Any],
    rows: Rows,
    plan: ExtractPlan,
    online: OnlineSection | None = None,
) -> ExtractManifest:
    """Deterministic content (no timestamps): every rank writes the same bytes. ``online``:
    the engine the train stage starts (extract.mode=online, no files).

    Offline, ``row_sha256`` vouches for every file: entry i is the hash of row i (written
    before the files, so a file of this run is always proven by it), then the hashes the
    existing manifest records past the rows (files a shrink kept). Called after
    :func:`check_manifest` removed every file these hashes would not describe."""
    mpath = out / MANIFEST
    manifest = ExtractManifest(
        **key,
        samples=ManifestSamples(count=len(rows), tokens=rows.tokens, input_ids_sha256=rows.sha256),
        plan=plan,
        mode="offline" if online is None else "online",
        online=online,
        row_sha256=(
            None
            if online is not None
            else row_hashes(rows) + _carried_hashes(mpath, key, len(rows))
        ),
    )
    manifest.write(mpath)
    return manifest


def manifest_count(out: Path) -> int:
    """How many rows the existing files were extracted from (0 when unknown)."""
    with contextlib.suppress(RecordError, TypeError, ValueError):
        return ExtractManifest.read(out / MANIFEST).samples.count
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


def verify_token_ids(
    out: Path, rows: Rows, files: dict[int, Path], on_mismatch: str
) -> dict[int, Path]:
    """Each reusable file's ``token_ids`` must be its row's ``input_ids`` (reads only that
    small tensor): a manifest that does not describe its files (files copied or edited by
    hand) is caught before they are trusted. A file that differs is a mismatch like any
    other: refused, or with ``on_mismatch=restart`` deleted and redone. Returns the files
    that stay reusable."""
    import numpy as np
    from safetensors import safe_open

    bad: list[int] = []
    for i in sorted(k for k in files if k < len(rows)):
        try:
            with safe_open(str(files[i]), framework="numpy") as fh:
                tok = fh.get_tensor("token_ids")
        except Exception:  # unreadable: drop_damaged's header check redoes it
            continue
        if np.array_equal(tok, rows.input_ids([i])[0]):
            continue
        if on_mismatch != "restart":
            raise StageError(
                f"{files[i]}: token_ids differ from row {i} of {rows.path} although "
                f"{MANIFEST} records that row: the files come from other rows; remove "
                f"them or set extract.on_mismatch=restart"
            )
        bad.append(i)
    if bad:
        log.warning(
            "%s: discarding %d of %d hidden-state files, redone (extract.on_mismatch=restart): "
            "the token_ids of files %s differ from their rows of %s",
            out,
            len(bad),
            len(files),
            _spans(bad),
            rows.path,
        )
        for i in bad:
            files[i].unlink(missing_ok=True)
    return {i: f for i, f in files.items() if i not in bad}


def remove_stale_temps(out: Path) -> int:
    """Temp files of a killed run (a hard kill runs no cleanup)."""
    n = 0
    for f in out.glob(TMP_GLOB):
        f.unlink(missing_ok=True)
        n += 1
    return n
