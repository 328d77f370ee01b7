"""The ``hf`` extraction backend: the target's language model in this process.

Only the language model is loaded (never a vision tower or the lm_head), rows are
batched by length, a writer thread serializes while the next batch computes, and a
rerun resumes by whole batches. The ``vllm`` backend is
:mod:`eagle3_pipeline.extract.vllm_backend`; both write the same files under the same
manifest.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from eagle3_pipeline.extract.batch_plan import plan_batches, rank_batches
from eagle3_pipeline.extract.extraction import (
    Extraction,
    begin,
    bytes_needed,
    check_output_disk,
    cleanup_if_empty,
    extract_record,
    target_precision,
)
from eagle3_pipeline.extract.manifest import write_manifest
from eagle3_pipeline.extract.record import ExtractPlan, ExtractRecord
from eagle3_pipeline.extract.view import ExtractInputs
from eagle3_pipeline.extract.writer import FAULT_NAME, BatchWriter, Timings
from eagle3_pipeline.runtime.faults import fault_after
from eagle3_pipeline.targets.capture import Capture, check_capture, forward_batch, pad_id
from eagle3_pipeline.targets.loading import LanguageModel, load_language_model

Batches = list[tuple[int, list[int]]]  # (index in the plan, rows)


@dataclass
class Work:
    """This rank's batches and which of their rows already have a complete file."""

    plan: list[list[int]]
    mine: Batches
    done: set[int]
    todo: Batches  # batches with at least one row to compute

    def rows_todo(self) -> list[int]:
        return [i for _, b in self.todo for i in b if i not in self.done]


def plan_work(ex: Extraction, cfg: ExtractInputs) -> Work:
    """Resume by batch: a batch whose every row has a complete file is skipped; the others
    are recomputed whole (same padding, so the same bytes) and only missing rows written."""
    e = cfg.extract
    rows = ex.rows
    plan = plan_batches(rows.lengths, e.batch_tokens, e.plan_rows)
    mine = rank_batches(plan, e.rank, e.world_size)
    done = {i for i in ex.reusable if i < len(rows)}  # begin() dropped the damaged ones
    todo = [(j, b) for j, b in mine if not all(i in done for i in b)]
    return Work(plan, mine, done, todo)


def extract_hf(cfg: ExtractInputs, progress: bool = True) -> ExtractRecord:
    """The ``hf`` backend: run the target's language model over the prepared rows and
    write their hidden states; resumable, split by rank. Returns the stage's record."""
    t_start = time.perf_counter()
    ex = begin(cfg, "hf")
    e = cfg.extract
    spec = ex.spec
    work = plan_work(ex, cfg)
    n_layers = len(spec.aux_layer_ids) + 1
    wrote_manifest = False
    timings = Timings()
    stats: dict[str, Any] = {"tokens_computed": 0, "padded_tokens": 0}
    try:
        check_output_disk(
            ex.out, bytes_needed(ex.rows, work.rows_todo(), n_layers, spec.hidden_size, e.dtype)
        )
        lm = None
        if work.todo:
            lm = load_language_model(
                spec,
                ex.model_dir,
                target_precision(cfg).dtype,
                cfg.hardware.device,
                cfg.hardware.gpu_count,
            )
        write_manifest(
            ex.out,
            ex.key,
            ex.rows,
            ExtractPlan(batch_tokens=e.batch_tokens, plan_rows=e.plan_rows, batches=len(work.plan)),
        )
        wrote_manifest = True
        if lm is not None:
            _run_batches(lm, ex, cfg, work, timings, stats, progress)
    except BaseException:
        cleanup_if_empty(ex, wrote_manifest)
        raise
    if lm is not None:
        stats["device"] = lm.device.type
        stats["model_dtype"] = str(lm.model.dtype).removeprefix("torch.")
    return _record(cfg, ex, work, timings, stats, t_start)


def _record(
    cfg: ExtractInputs,
    ex: Extraction,
    work: Work,
    timings: Timings,
    stats: dict[str, Any],
    started: float,
) -> ExtractRecord:
    import torch

    tokens = stats["tokens_computed"]
    return extract_record(
        cfg,
        ex.spec,
        ex.rows,
        backend="hf",
        started=started,
        written=timings.files_written,
        reused=sum(1 for _, b in work.mine for i in b if i in work.done),
        tokens_computed=tokens,
        compute_s=stats.get("loop_wall_s", 0.0),
        bytes_written=timings.bytes_written,
        batches_total=len(work.plan),
        batches_rank=len(work.mine),
        batches_computed=len(work.todo),
        batches_skipped=len(work.mine) - len(work.todo),
        padding_efficiency=tokens / stats["padded_tokens"] if stats["padded_tokens"] else 1.0,
        compute_wall_s=stats.get("loop_wall_s", 0.0),
        forward_s=timings.forward_s,
        capture_s=timings.capture_s,
        serialize_s=timings.serialize_s,
        fsync_s=timings.fsync_s,
        queue_wait_s=timings.queue_wait_s,
        threads=torch.get_num_threads(),
        peak_gpu_memory_bytes=(
            int(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else None
        ),
        device=stats.get("device"),
        model_dtype=stats.get("model_dtype"),
    )


def _run_batches(
    lm: LanguageModel,
    ex: Extraction,
    cfg: ExtractInputs,
    work: Work,
    timings: Timings,
    stats: dict[str, Any],
    progress: bool,
) -> None:
    """Forward every batch to compute and hand its new rows to the writer thread; on any
    failure the writer stops after its current file (complete files stay resumable)."""
    import torch
    from tqdm import tqdm

    e = cfg.extract
    out_dtype = getattr(torch, e.dtype)
    pad = pad_id(lm.model)
    fail_after = fault_after(FAULT_NAME)
    capture = Capture(lm, ex.spec.aux_layer_ids)
    writer = BatchWriter(ex.out, e.writer_queue, e.fsync, timings, fail_after)
    total = sum(ex.rows.lengths[i] for _, b in work.todo for i in b)
    bar = tqdm(
        total=total,
        unit="tok",
        unit_scale=True,
        desc=f"extract hf rank {e.rank}",
        disable=not progress,
        mininterval=1.0,
    )
    t0 = time.perf_counter()
    ok = False
    try:
        with torch.inference_mode():
            for n_batch, (_j, batch) in enumerate(work.todo):
                seqs = ex.rows.input_ids(batch)
                tf = time.perf_counter()
                last, _ = forward_batch(lm, seqs, pad)
                if lm.device.type == "cuda":
                    torch.cuda.synchronize()
                tc = time.perf_counter()
                hs = capture.take()
                if n_batch == 0:
                    check_capture(lm, hs, last)
                items = _new_items(batch, seqs, hs.to(out_dtype).cpu(), work.done)
                td = time.perf_counter()
                timings.forward_s += tc - tf
                timings.capture_s += td - tc
                real = sum(len(s) for s in seqs)
                stats["tokens_computed"] += real
                stats["padded_tokens"] += len(seqs) * max(len(s) for s in seqs)
                writer.put(items)
                bar.update(real)
        writer.close()
        ok = True
    finally:
        if not ok:
            writer.abort()
        capture.remove()
        bar.close()
        stats["loop_wall_s"] = time.perf_counter() - t0


def _new_items(
    batch: list[int], seqs: list[Any], hs: Any, done: set[int]
) -> list[tuple[int, Any, Any]]:
    """(row, token_ids, hidden states without the padding) for the batch's rows that
    have no complete file yet."""
    import torch

    items = []
    for b, row in enumerate(batch):
        if row in done:
            continue
        n = len(seqs[b])
        # a copy: the dataset's arrays are read-only views, which from_numpy warns about
        items.append((row, torch.tensor(seqs[b]), hs[b, :n]))
    return items
