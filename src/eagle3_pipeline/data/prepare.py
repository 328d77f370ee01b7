"""Conversations -> speculators training rows (data/prepared/, with token_freq.pt) and
held-out prompts for validation (data/heldout/prompts.jsonl): what the prepare stage builds.

With ``data.regenerate``, every trained assistant turn is the target's own greedy answer,
token for token (:mod:`eagle3_pipeline.data.regenerate`); otherwise the recorded turns are
used (:mod:`eagle3_pipeline.data.rows`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config import DataConfig
from eagle3_pipeline.core.errors import StageError
from eagle3_pipeline.core.io import atomic_write_text
from eagle3_pipeline.data.bad_lines import write_bad_lines
from eagle3_pipeline.data.bad_input import ErrorLog
from eagle3_pipeline.data.conversation import (
    Conversation,
    conversation_set_sha256,
    load_conversations,
    select,
)
from eagle3_pipeline.data.heldout import heldout_jsonl, heldout_records
from eagle3_pipeline.data.rows import (
    end_of_turn_ids,
    finalize_rows,
    load_tokenizer,
    recorded_rows,
    turn_tokens,
    write_prepared,
)
from eagle3_pipeline.runtime.precision import model_precision
from eagle3_pipeline.data.view import PrepareInputs
from eagle3_pipeline.data.pinned import PinnedFileError, data_file
from eagle3_pipeline.data.record import PrepareRecord, Regeneration
from eagle3_pipeline.targets.adapter import load_target_spec, read_json
from eagle3_pipeline.targets.chat import render_ids
from eagle3_pipeline.targets.families import family_for_config
from eagle3_pipeline.targets.tiny import REASONING_MARKERS as TINY_REASONING_MARKERS

log = logging.getLogger(__name__)


def prepared_dir(cfg: PrepareInputs) -> Path:
    return Path(cfg.paths.prepared)


def heldout_path(cfg: PrepareInputs) -> Path:
    return Path(cfg.paths.heldout) / "prompts.jsonl"


def bad_lines_path(cfg: PrepareInputs) -> Path:
    return Path(cfg.paths.bad_lines)


# Reasons that say a record is not a conversation at all (the file has another shape).
SHAPE_REASONS = frozenset({"malformed_record", "unknown_format"})


def no_conversation_message(d: DataConfig, n_in: int, bad: ErrorLog, report: Path) -> str:
    """One line for input with nothing to train on: an empty source says so plainly (not
    "0 of 0"); otherwise the reasons and where every bad record is listed."""
    source = f"data.path={d.path}" if d.source != "builtin" else "data.source=builtin"
    if bad.entries and set(bad.counts) <= SHAPE_REASONS:
        return (
            f"{source}: not a file of conversations: none of its {n_in} records is a ShareGPT "
            f"or OpenAI conversation (first: {bad.entries[0].message}); expected a JSON array "
            '(or JSONL) of {"conversations": [{"from": "human", "value": ...}, ...]} or '
            '{"messages": [{"role": "user", "content": ...}, ...]} objects'
        )
    if n_in == 0:
        return (
            f"{source}: no conversation in it (empty); point data.path at a JSONL file "
            "of conversations (OpenAI 'messages' or ShareGPT 'conversations')"
        )
    return (
        f"{source}: none of its {n_in} records is a usable conversation ({bad.summary()}); "
        f"every one is listed in {report}"
    )


def regenerate_cache_dir(cfg: PrepareInputs) -> Path:
    """Outside every DVC output on purpose: it survives a failed or re-run stage."""
    return Path(cfg.paths.cache) / "regenerate"


def reasoning_markers(cfg: PrepareInputs, model_dir: Path) -> tuple[str, ...]:
    """The reasoning-block markers of the target's family (the registry's, by the target's
    ``config.json``). A tiny target speaks the tiny tokenizer's chat format whatever its
    family (:mod:`eagle3_pipeline.targets.tiny`), so its markers are that format's."""
    if cfg.model.tiny is not None:
        return TINY_REASONING_MARKERS
    config = read_json(model_dir / "config.json", "the target's config.json")
    return family_for_config(config).reasoning_markers


def target_content(cfg: PrepareInputs, model_dir: Path) -> dict[str, Any]:
    """What identifies the target's content in the regeneration cache's key: config,
    tokenizer and chat template by SHA-256, and the weights by SHA-256 too for a target
    built here (a rebuilt, identical one hits the cache) -- each shard read once, then
    remembered by path, size, mtime and inode. A target from ``model.path`` or the hub
    follows ``model.fingerprint`` (``stat`` by default: a 600 GB checkpoint is not read).
    Paths and mtimes of small files never enter the key."""
    from eagle3_pipeline.targets.fingerprint import fingerprint_dir

    mode = "content" if cfg.model.built_here else str(cfg.model.fingerprint)
    return fingerprint_dir(model_dir, mode, Path(cfg.paths.cache) / "target_sha256.json")["files"]


def make_backend(
    cfg: PrepareInputs,
    spec: Any,
    model_dir: Path,
    tokenizer: Any,
    eot: list[int],
    server: Any = None,
    dtype: str = "float32",
) -> Any:
    """The regeneration backend; ``server``: the ``vllm serve`` this run started, if any
    (its per-run API key), else a server the user runs (key from ``api_key_env``);
    ``dtype``: the target's precision (the hf backend's; a server was started in it)."""
    from eagle3_pipeline.data.regenerate.hf import HFBackend
    from eagle3_pipeline.data.regenerate.server import ServerBackend

    d = cfg.data
    if d.regenerate_backend == "hf":
        cuda = cfg.hardware.device == "cuda"
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eot[0]
        return HFBackend(
            model_dir,
            eot,
            pad,
            d.max_new_tokens,
            d.generate_batch_size,
            device="cuda" if cuda else "cpu",
            dtype=dtype,
        )
    from eagle3_pipeline.serving.identity import expected_model

    s = d.server
    expected = expected_model(
        f"{spec.name} ({model_dir})",
        (spec.name, model_dir, cfg.model.path, cfg.model.hub_id),
        tokenizer,
    )
    api_key = server.api_key if server is not None else os.environ.get(s.api_key_env)
    return ServerBackend(
        s.base_url,
        d.max_new_tokens,
        expected=expected,
        model=s.model,
        api_key=api_key,
        concurrency=s.concurrency,
        timeout_s=s.timeout_s,
        retries=s.retries,
        temperature=s.temperature,
    )


def server_context(
    cfg: PrepareInputs, spec: Any, model_dir: Path, dtype: str
) -> contextlib.AbstractContextManager[Any]:
    """``vllm serve`` for the run, in ``dtype``, when ``data.server.start``; else nothing
    to manage."""
    from eagle3_pipeline.data.regenerate.server import managed_server
    from eagle3_pipeline.serving.engine import build_engine, log_file
    from eagle3_pipeline.serving.env import find_python

    s = cfg.data.server
    if cfg.data.regenerate_backend != "server" or not s.start:
        return contextlib.nullcontext()
    engine = build_engine(cfg, spec, model_dir, "regenerate", dtype=dtype)
    return managed_server(
        engine,
        find_python(cfg.vllm.python),
        s.base_url,
        cfg.vllm.startup_timeout_s,
        cfg.vllm.shutdown_timeout_s,
        log_file(cfg, "regenerate"),
    )


def prepare(cfg: PrepareInputs, progress: bool = True) -> PrepareRecord:
    """Build every output in memory, then write them; return the stage's record."""
    d = cfg.data
    t0 = time.perf_counter()
    source_file = None
    if d.source == "file":  # first, before anything is written: a wrong pinned file
        try:
            source_file = data_file(d, Path(cfg.paths.cache))
        except PinnedFileError as exc:
            raise StageError(str(exc)) from None
    spec = load_target_spec(Path(cfg.paths.target) / "target.json")
    model_dir = Path(str(spec.path))
    m = cfg.model
    precision = model_precision(
        m.dtype, cfg.hardware.device, m.tiny is not None, cfg.paths.precision
    )
    tokenizer = load_tokenizer(model_dir, spec.trust_remote_code)
    eot = end_of_turn_ids(tokenizer, model_dir)
    convs, bad, n_in = load_conversations(d, cfg.seed, require_assistant=not d.regenerate)
    report = bad_lines_path(cfg)
    write_bad_lines(bad, report)
    bad.raise_if_failing(report)
    if not convs:
        raise StageError(no_conversation_message(d, n_in, bad, report))

    def heldout_fits(conv: Conversation) -> bool:
        """A held-out prompt leaves room for an answer of data.max_new_tokens within
        data.max_seq_len (the target's window here): validation generates after it."""
        prompt = render_ids(tokenizer, conv.prompt(), generation_prompt=True)
        return len(prompt) + d.max_new_tokens <= d.max_seq_len

    held, train = select(convs, d.heldout_size, cfg.train.samples, cfg.seed, heldout_fits)
    held_text = heldout_jsonl(heldout_records(held, tokenizer))

    errors: Counter[str] = Counter(bad.counts)
    dropped: Counter[str] = Counter()
    regen: Regeneration | None = None
    if d.regenerate:
        from eagle3_pipeline.data.regenerate.turns import GenerationCache, cache_path, regenerate_rows

        with server_context(cfg, spec, model_dir, precision.dtype) as server:
            backend = make_backend(cfg, spec, model_dir, tokenizer, eot, server, precision.dtype)
            key = {**backend.fingerprint(), "target": target_content(cfg, model_dir)}
            if server is not None:  # a server this run started answers in the run's precision
                key["dtype"] = precision.dtype
            cache = GenerationCache(cache_path(regenerate_cache_dir(cfg), key))
            rows, stats = regenerate_rows(
                train,
                backend,
                tokenizer,
                eot,
                d.max_seq_len,
                d.reasoning,
                cache,
                progress,
                markers=reasoning_markers(cfg, model_dir),
            )
        errors.update(stats.errors)
        dropped.update(stats.dropped)
        regen = stats.summary()
        if stats.prompt_mismatch:
            log.warning(
                "%d generations were conditioned on other token ids than our chat-template "
                "render (the server's template differs); its ids were used",
                stats.prompt_mismatch,
            )
        if stats.errors:
            log.warning(
                "regeneration: %d failed requests %s",
                sum(stats.errors.values()),
                dict(stats.errors),
            )
    else:
        rows = []
        for c in train:
            r, e = recorded_rows(c, tokenizer, eot, d.reasoning)
            rows.extend(r)
            errors.update(e)
    per_turn = turn_tokens(rows)
    final, drop, truncated = finalize_rows(rows, d.max_seq_len)
    dropped.update(drop)
    if not final:
        raise StageError(
            f"data: no training row left from {len(train)} conversations "
            f"(dropped {dict(dropped)}, errors {dict(errors)})"
        )

    write_prepared(final, prepared_dir(cfg))
    atomic_write_text(heldout_path(cfg), held_text)
    lengths = [len(r["input_ids"]) for r in final]
    supervised = sum(sum(r["loss_mask"]) for r in final)
    return PrepareRecord(
        source=d.source,
        conversations_in=n_in,
        conversations_invalid=n_in - len(convs),
        conversations_heldout=len(held),
        conversations_train=len(train),
        rows=len(final),
        rows_dropped=dict(sorted(dropped.items())),
        rows_truncated=truncated,
        errors=dict(sorted(errors.items())),
        tokens=sum(lengths),
        supervised_tokens=supervised,
        mean_tokens_per_row=sum(lengths) / len(lengths),
        max_tokens_per_row=max(lengths),
        max_seq_len=d.max_seq_len,
        regenerate=d.regenerate,
        backend=d.regenerate_backend if d.regenerate else None,
        precision=precision if d.regenerate else None,
        reasoning=d.reasoning,
        regeneration=regen,
        wall_s=round(time.perf_counter() - t0, 3),
        roles=str(d.roles),
        turns_dropped=dict(sorted(bad.turns_dropped.items())),
        truncated_tail=int(bad.truncated is not None),
        truncated_tail_offset=bad.truncated.offset if bad.truncated else None,
        truncated_tail_bytes=bad.truncated.bytes if bad.truncated else None,
        train_sha256=conversation_set_sha256(train),
        heldout_sha256=conversation_set_sha256(held),
        license=d.license,
        data_sha256=source_file.sha256 if source_file else None,
        pinned=source_file.pinned if source_file else None,
        turns=list(per_turn),
    )
