"""What both backends do before the first batch and after a failure.

Every check that can fail without a model (config, target.json's layers, tokenizer,
rows, output directory, manifest, disk space) runs first, so a bad input costs seconds,
not a model load; a failure before any file was written leaves nothing behind.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.errors import StageError
from eagle3_pipeline.extract.fingerprint import check_prepared_tokenizer, tokenizer_sha256
from eagle3_pipeline.extract.layout import MANIFEST, output_dir, prepared_rows_dir, target_json_path
from eagle3_pipeline.extract.manifest import (
    check_manifest,
    existing_files,
    file_matches,
    manifest_count,
    manifest_key,
    remove_stale_temps,
    verify_token_ids,
)
from eagle3_pipeline.extract.record import ExtractRecord
from eagle3_pipeline.extract.rows import Rows, load_rows
from eagle3_pipeline.extract.view import ExtractInputs
from eagle3_pipeline.runtime.dvc_cache import release_damaged
from eagle3_pipeline.runtime.precision import Precision, model_precision
from eagle3_pipeline.targets.adapter import TargetSpec, load_target_spec

log = logging.getLogger(__name__)

_ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass
class Extraction:
    """Everything checked before the first batch (shared by both backends)."""

    spec: TargetSpec
    model_dir: Path
    rows: Rows
    out: Path
    key: dict[str, Any]
    reusable: dict[int, Path]
    created_out: bool


def _check_layers(spec: TargetSpec, cfg: ExtractInputs) -> None:
    ids = list(spec.aux_layer_ids)
    bad = [k for k in ids if not (isinstance(k, int) and 0 <= k < spec.num_layers)]
    if not ids or bad or len(set(ids)) != len(ids):
        raise StageError(
            f"target.json: aux_layer_ids={ids} invalid for a {spec.num_layers}-layer target "
            f"(distinct ids in 0..{spec.num_layers - 1}; id k is the residual stream entering "
            f"layer k): rerun the target stage with a valid model.aux_layer_ids"
        )
    if cfg.model.aux_layer_ids is not None and list(cfg.model.aux_layer_ids) != ids:
        raise StageError(
            f"model.aux_layer_ids={list(cfg.model.aux_layer_ids)} differs from target.json "
            f"{ids}: rerun the target stage (target.json is the one place they are resolved)"
        )


def prepare_output(out: Path) -> bool:
    """Create the output directory and prove it is writable; True when created here."""
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write_probe.{os.getpid()}.tmp"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise StageError(
            f"{out}: output directory is not writable ({exc.strerror or exc})"
        ) from None
    return created


def checked_target(cfg: ExtractInputs) -> tuple[TargetSpec, Path, str]:
    """target.json's layers, the model directory and the prepared rows' tokenizer (both
    modes check these before anything else; the extract settings were checked at
    compose); the target's spec, its directory and its tokenizer's hash."""
    spec = load_target_spec(target_json_path(cfg))
    _check_layers(spec, cfg)
    model_dir = Path(spec.path or "")
    if not model_dir.is_dir():
        raise StageError(f"target.json: path={spec.path}: model directory not found")
    tok_sha = tokenizer_sha256(model_dir)
    check_prepared_tokenizer(prepared_rows_dir(cfg), tok_sha)
    return spec, model_dir, tok_sha


def target_precision(cfg: ExtractInputs) -> Precision:
    """The precision the target computes the states in (``model.dtype``, else preflight's
    choice): part of the files' key, since the states' values depend on it."""
    m = cfg.model
    return model_precision(m.dtype, cfg.hardware.device, m.tiny is not None, cfg.paths.precision)


def begin(cfg: ExtractInputs, backend: str) -> Extraction:
    """Every check that can fail before a model is loaded or a file is written."""
    spec, model_dir, tok_sha = checked_target(cfg)
    out = output_dir(cfg)
    old_count = manifest_count(out)
    rows = load_rows(
        prepared_rows_dir(cfg), spec.vocab_size, prefix_at=[old_count] if old_count else []
    )
    created = prepare_output(out)
    remove_stale_temps(out)
    key = manifest_key(
        spec, model_dir, cfg.extract.dtype, backend, tok_sha, target_precision(cfg).dtype
    )
    try:
        reusable = check_manifest(out, key, rows, cfg.extract.on_mismatch)
        if old_count > len(rows):  # a shrink: the files' own token ids confirm the proof
            reusable = verify_token_ids(out, rows, reusable, cfg.extract.on_mismatch)
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    reusable = drop_damaged(
        reusable, rows, len(spec.aux_layer_ids) + 1, spec.hidden_size, cfg.extract.dtype
    )
    return Extraction(spec, model_dir, rows, out, key, reusable, created)


def drop_damaged(
    files: dict[int, Path], rows: Rows, n_layers: int, hidden: int, dtype: str
) -> dict[int, Path]:
    """The files that are whole (header checked against size and shape); a damaged one is
    removed -- with any DVC cache object it shares its bytes with -- and redone."""
    kept: dict[int, Path] = {}
    damaged: list[Path] = []
    for i, p in files.items():
        if i >= len(rows) or file_matches(p, rows.lengths[i], n_layers, hidden, dtype):
            kept[i] = p
        else:
            damaged.append(p)
            release_damaged(p)
    if damaged:
        log.warning(
            "%d damaged hidden-state file(s) removed and redone: %s",
            len(damaged),
            ", ".join(p.name for p in damaged[:5]) + (" ..." if len(damaged) > 5 else ""),
        )
    return kept


def bytes_needed(rows: Rows, todo: Sequence[int], n_layers: int, hidden: int, dtype: str) -> int:
    """Disk space the files of rows ``todo`` take (data plus a header allowance)."""
    per_token = n_layers * hidden * _ITEMSIZE[dtype] + 8
    return sum(rows.lengths[i] * per_token + 512 for i in todo)


def check_output_disk(out: Path, need: int) -> None:
    """Refuse before computing rather than fail on a full disk hours later."""
    free = shutil.disk_usage(out).free
    if need > free:
        raise StageError(
            f"{out}: needs {need / 1e9:.2f} GB for the remaining hidden states, "
            f"{free / 1e9:.2f} GB free"
        )


def peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def extract_record(
    cfg: ExtractInputs,
    spec: TargetSpec,
    rows: Rows,
    *,
    backend: str,
    started: float,
    written: int,
    reused: int,
    tokens_computed: int,
    compute_s: float,
    bytes_written: int,
    **figures: Any,
) -> ExtractRecord:
    """The stage's record, for every backend and mode: what they share is filled here once
    (``started``: the run's ``time.perf_counter()`` at its start; ``compute_s``: the time
    spent computing ``tokens_computed``); ``figures`` are the backend's own optional fields
    of :class:`ExtractRecord`."""
    e = cfg.extract
    return ExtractRecord(
        mode=str(e.mode),
        backend=backend,
        hardware=cfg.hardware.name,
        target=spec.name,
        aux_layer_ids=list(spec.aux_layer_ids),
        dtype=str(e.dtype),
        precision=target_precision(cfg),
        rank=e.rank,
        world_size=e.world_size,
        samples=len(rows),
        tokens=rows.tokens,
        samples_written=written,
        samples_reused=reused,
        tokens_computed=tokens_computed,
        tokens_per_s=tokens_computed / compute_s if compute_s > 0 else 0.0,
        wall_s=time.perf_counter() - started,
        bytes_written=bytes_written,
        bytes_per_token=bytes_written / tokens_computed if tokens_computed else 0.0,
        peak_rss_bytes=peak_rss_bytes(),
        **figures,
    )


def cleanup_if_empty(ex: Extraction, wrote_manifest: bool) -> None:
    """After a failure before any file was written: leave nothing behind."""
    if existing_files(ex.out):
        return
    if wrote_manifest:
        (ex.out / MANIFEST).unlink(missing_ok=True)
    if ex.created_out:
        shutil.rmtree(ex.out, ignore_errors=True)
