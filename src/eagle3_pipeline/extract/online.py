"""``extract.mode=online``: record what online training needs, store no hidden states.

At scale the hidden states are the cost: 56 KiB per token for Kimi-K2.5, tens of TB for
the usual data recipes. Online, the train stage serves the target in vLLM with the same
``extract_hidden_states`` engine and connector as the ``vllm`` backend and reads each
batch's states from it, discarding them after the step. This stage still runs every check
the offline backends run before their first batch (target layers, tokenizer, rows) and
writes ``manifest.json``, the train stage's only input from here: the same key as an
offline manifest (target, layers, dtype, tokenizer, rows) plus the engine to start.

Files an earlier offline run left are removed, so the directory holds exactly what this
mode promises (DVC's cache still has them: ``dvc checkout`` of that commit restores them).
"""

from __future__ import annotations

import logging
import time

from eagle3_pipeline.core.errors import ConfigError
from eagle3_pipeline.extract.extraction import (
    checked_target,
    extract_record,
    prepare_output,
    target_precision,
)
from eagle3_pipeline.extract.layout import MANIFEST, output_dir, prepared_rows_dir
from eagle3_pipeline.extract.manifest import (
    existing_files,
    manifest_key,
    remove_stale_temps,
    write_manifest,
)
from eagle3_pipeline.extract.record import ExtractPlan, ExtractRecord, OnlineSection
from eagle3_pipeline.extract.rows import load_rows
from eagle3_pipeline.extract.view import ExtractInputs
from eagle3_pipeline.extract.vllm_backend import vllm_layer_ids
from eagle3_pipeline.serving.engine import STAGING_PLACEHOLDER, Engine, build_engine, log_file

log = logging.getLogger(__name__)


def online_section(cfg: ExtractInputs, engine: Engine) -> OnlineSection:
    """What the train stage needs to start and talk to the extraction server."""
    e, v = cfg.extract, cfg.vllm
    return OnlineSection(
        engine=engine,
        python=v.python,
        port=e.server.port,
        concurrency=e.server.concurrency,
        staging_dir=e.staging_dir,
        startup_timeout_s=v.startup_timeout_s,
        shutdown_timeout_s=v.shutdown_timeout_s,
        log_file=str(log_file(cfg, "online")),
    )


def record_online(cfg: ExtractInputs) -> ExtractRecord:
    """The checks of an offline extraction, then the manifest for online training."""
    t0 = time.perf_counter()
    spec, model_dir, tok_sha = checked_target(cfg)
    rows = load_rows(prepared_rows_dir(cfg), spec.vocab_size)
    # the train stage picks the connector's directory when it starts the server
    engine = build_engine(
        cfg,
        spec,
        model_dir,
        "extract",
        staging=STAGING_PLACEHOLDER,
        dtype=target_precision(cfg).dtype,
    )
    longest = max(rows.lengths)
    if longest + 1 > engine.max_model_len:  # the profile's, capped at the model's window
        raise ConfigError(
            f"{rows.path}: a row of {longest} tokens does not fit vLLM's max_model_len "
            f"{engine.max_model_len} (hardware.serving.max_model_len="
            f"{cfg.hardware.serving.max_model_len}, the model's window "
            f"{spec.max_position_embeddings}) with the 1 token it generates"
        )
    out = output_dir(cfg)
    prepare_output(out)
    remove_stale_temps(out)
    old = existing_files(out)
    for f in old.values():
        f.unlink()
    if old:
        log.info(
            "%s: removed %d offline hidden-state files (online mode stores none; "
            "DVC's cache keeps them)",
            out,
            len(old),
        )
    key = manifest_key(
        spec, model_dir, cfg.extract.dtype, "vllm", tok_sha, target_precision(cfg).dtype
    )
    write_manifest(
        out,
        key,
        rows,
        ExtractPlan(vllm_layer_ids=vllm_layer_ids(spec)),
        online=online_section(cfg, engine),
    )
    return extract_record(
        cfg,
        spec,
        rows,
        backend="vllm",
        started=t0,
        written=0,
        reused=0,
        tokens_computed=0,
        compute_s=0.0,
        bytes_written=(out / MANIFEST).stat().st_size,
        vllm_layer_ids=vllm_layer_ids(spec),
        offline_files_removed=len(old),
    )
