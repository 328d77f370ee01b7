"""The ``vllm`` extraction backend: the right one for a target that needs a GPU server
(Kimi-K2.5 on 8x RTX PRO 6000).

vLLM's ``extract_hidden_states`` speculative method stores, for each prompt, the residual
stream entering each listed layer; layer id ``num_layers`` is the final hidden state
before the final norm (speculators' ``launch_vllm.py`` appends it the same way). The
``ExampleHiddenStatesConnector`` writes one safetensors file per request (``hidden_states``
``[seq, n_layers, hidden]`` + ``token_ids``) under ``shared_storage_path``; speculators'
``generate-offline-data`` client sends every prepared row and moves each file to
``hs_{i}.safetensors``. We then validate every file against its row and convert it to
``extract.dtype``, so both backends write the same format under the same manifest.

The server comes from the one engine builder (:mod:`eagle3_pipeline.serving.engine`) and
runs in the vLLM environment. On vLLM's CPU build the upstream connector cannot run;
:mod:`eagle3_pipeline.compat.vllm` swaps in the CPU-safe one, with the same files.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from eagle3_pipeline.compat.offline_client import MODULE as OFFLINE_CLIENT
from eagle3_pipeline.compat.offline_client import client_env
from eagle3_pipeline.core.errors import StageError
from eagle3_pipeline.extract.extraction import (
    Extraction,
    begin,
    bytes_needed,
    check_output_disk,
    cleanup_if_empty,
    extract_record,
    target_precision,
)
from eagle3_pipeline.extract.layout import hs_path
from eagle3_pipeline.extract.manifest import write_manifest
from eagle3_pipeline.extract.record import ExtractPlan, ExtractRecord
from eagle3_pipeline.extract.rows import Rows
from eagle3_pipeline.extract.view import ExtractInputs
from eagle3_pipeline.extract.writer import Timings, save_hidden_states
from eagle3_pipeline.serving.engine import build_engine, log_file
from eagle3_pipeline.serving.env import find_python
from eagle3_pipeline.serving.server import child_process, engine_server
from eagle3_pipeline.targets.adapter import TargetSpec

log = logging.getLogger(__name__)

STAGING = ".vllm_staging"  # inside the output dir: same filesystem, so moves are renames


def vllm_layer_ids(spec: TargetSpec) -> list[int]:
    """The aux ids, then ``num_layers`` (= the final state before the norm)."""
    return [*spec.aux_layer_ids, spec.num_layers]


def client_command(cfg: ExtractInputs, spec: TargetSpec, prepared: Path, out: Path) -> list[str]:
    """speculators' offline generation client over the prepared rows. It skips rows whose
    file exists (so a rerun resumes) and checks the served model is ``--model``. It runs
    through :mod:`eagle3_pipeline.compat.offline_client`, which makes it send the server's
    API key (speculators' client sends none)."""
    e = cfg.extract
    return [
        sys.executable,
        "-m",
        OFFLINE_CLIENT,
        "generate-offline-data",
        "--endpoint",
        f"http://127.0.0.1:{e.server.port}/v1",
        "--model",
        spec.name,
        "--preprocessed-data",
        str(prepared),
        "--output",
        str(out),
        "--concurrency",
        str(e.server.concurrency),
        "--validate-outputs",
        "--fail-on-error",
        "--world-size",
        str(e.world_size),
        "--rank",
        str(e.rank),
    ]


# --------------------------------------------------------------------------- files


def validate_and_convert(
    rows: Rows,
    out: Path,
    indices: Sequence[int],
    n_layers: int,
    hidden: int,
    dtype: str,
    fsync: bool = True,
    timings: Timings | None = None,
) -> int:
    """Check each file the server wrote against its row (keys, token ids, shape, finite
    values) and rewrite it in ``dtype`` when it differs. A bad file is deleted and named:
    speculators' loader would otherwise drop that sample with only a warning."""
    import numpy as np
    import torch
    from safetensors.torch import load_file

    want = getattr(torch, dtype)
    converted = 0
    for i in indices:
        path = hs_path(out, i)
        problem = None
        try:
            data = load_file(str(path))
        except FileNotFoundError:
            raise StageError(f"{path}: missing after vLLM extraction (row {i})") from None
        except Exception as exc:
            data, problem = {}, f"unreadable ({exc})"
        if problem is None:
            tok, hs = data.get("token_ids"), data.get("hidden_states")
            if tok is None or hs is None:
                problem = f"keys {sorted(data)}, expected token_ids and hidden_states"
            elif not np.array_equal(tok.numpy(), rows.input_ids([i])[0]):
                problem = "token_ids differ from the row's input_ids"
            elif list(hs.shape) != [rows.lengths[i], n_layers, hidden]:
                problem = (
                    f"hidden_states shape {list(hs.shape)} != {[rows.lengths[i], n_layers, hidden]}"
                )
            elif not bool(torch.isfinite(hs).all()):
                problem = "non-finite hidden states"
        if problem is not None:
            path.unlink(missing_ok=True)
            raise StageError(f"{path}: {problem} (row {i}); the file was removed")
        assert tok is not None and hs is not None  # no problem: both were read
        if hs.dtype != want or tok.dtype != torch.int64:
            save_hidden_states(path, tok.to(torch.int64), hs.to(want), fsync, timings)
            converted += 1
    return converted


def extract_vllm(cfg: ExtractInputs) -> ExtractRecord:
    """Serve the target with the extract-hidden-states config, drive speculators' client
    over the prepared rows, validate the files, always shut the server down."""
    t0 = time.perf_counter()
    ex: Extraction = begin(cfg, "vllm")
    spec, rows, out = ex.spec, ex.rows, ex.out
    n_layers = len(spec.aux_layer_ids) + 1
    longest = max(rows.lengths)
    # what the engine gets: the profile's length, capped at the model's window
    window = min(
        cfg.hardware.serving.max_model_len,
        spec.max_position_embeddings or cfg.hardware.serving.max_model_len,
    )
    if longest + 1 > window:
        raise StageError(
            f"{rows.path}: a row of {longest} tokens does not fit vLLM's max_model_len "
            f"{window} (hardware.serving.max_model_len={cfg.hardware.serving.max_model_len}, "
            f"the model's window {spec.max_position_embeddings}) with the 1 token it generates"
        )
    mine = _rank_rows(len(rows), cfg.extract.rank, cfg.extract.world_size)
    todo = [i for i in mine if i not in ex.reusable]
    wrote_manifest = False
    timings = Timings()
    try:
        check_output_disk(
            out, bytes_needed(rows, todo, n_layers, spec.hidden_size, cfg.extract.dtype)
        )
        write_manifest(out, ex.key, rows, ExtractPlan(vllm_layer_ids=vllm_layer_ids(spec)))
        wrote_manifest = True
        staging = out / STAGING
        gen_wall = 0.0
        if todo:
            staging.mkdir(exist_ok=True)
            engine = build_engine(
                cfg,
                spec,
                ex.model_dir,
                "extract",
                staging=staging,
                dtype=target_precision(cfg).dtype,
            )
            server = engine_server(
                engine,
                find_python(cfg.vllm.python),
                cfg.extract.server.port,
                log_file(cfg, "extract"),
                cfg.vllm.startup_timeout_s,
                cfg.vllm.shutdown_timeout_s,
                port_key="extract.server.port",
            )
            with server:
                g0 = time.perf_counter()
                client = client_command(cfg, spec, rows.path.resolve(), out.resolve())
                with child_process(client, env=client_env(server.api_key)) as proc:
                    rc = proc.wait()
                gen_wall = time.perf_counter() - g0
                if rc != 0:
                    died = server.death()
                    raise StageError(
                        f"{died}; rerun (`dvc repro`) to resume"
                        if died
                        else f"speculators generate-offline-data exited with {rc}"
                    )
        converted = validate_and_convert(
            rows,
            out,
            todo,
            n_layers,
            spec.hidden_size,
            cfg.extract.dtype,
            cfg.extract.fsync,
            timings,
        )
        with contextlib.suppress(OSError):
            staging.rmdir()
    except BaseException:
        cleanup_if_empty(ex, wrote_manifest)
        raise
    serving = cfg.hardware.serving
    return extract_record(
        cfg,
        spec,
        rows,
        backend="vllm",
        started=t0,
        written=len(todo),
        reused=len(mine) - len(todo),
        tokens_computed=sum(rows.lengths[i] for i in todo),
        compute_s=gen_wall,
        bytes_written=sum(hs_path(out, i).stat().st_size for i in todo),
        vllm_layer_ids=vllm_layer_ids(spec),
        samples_converted=converted,
        tensor_parallel_size=serving.tensor_parallel_size,
        pipeline_parallel_size=serving.pipeline_parallel_size,
        enable_expert_parallel=serving.enable_expert_parallel,
    )


def _rank_rows(n: int, rank: int, world_size: int) -> list[int]:
    """The rows speculators' client assigns to this rank (contiguous chunks, remainder to
    the first ranks: ``get_indices_to_process``)."""
    chunk, rem = divmod(n, world_size)
    start = rank * chunk + min(rank, rem)
    return list(range(start, start + chunk + (1 if rank < rem else 0)))
