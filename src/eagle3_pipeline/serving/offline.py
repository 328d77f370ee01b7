"""Run one offline vLLM engine in the vLLM environment and read back its result.

The training environment cannot import vLLM (see :mod:`eagle3_pipeline.serving.env`), so
the engine runs in :mod:`eagle3_pipeline.serving.worker` under the vLLM environment's
interpreter, with the engine's environment variables (the CPU-build workarounds) set for
that process only. Its output goes to a log; a failure is reported as one line naming the
cause, taken from that log, and the log's path.
"""

from __future__ import annotations

import json
import logging
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline.serving.engine import Engine
from eagle3_pipeline.serving.env import worker_env
from eagle3_pipeline.serving.result import VllmResultError, VllmRun
from eagle3_pipeline.serving.server import cause

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pass:
    """A further decoding of the same prompts on an engine already loaded: sampled at
    ``temperature`` (seeded per prompt), with ``concurrency`` requests in flight, over the
    prompts ``subset`` lists (indices; None: all)."""

    name: str
    temperature: float = 0.0
    seed: int | None = None
    concurrency: int = 1
    # counters per label: with concurrency > 1 one label's prompts run at a time
    labels: bool = False
    subset: tuple[int, ...] | None = None

    def to_job(self) -> dict[str, Any]:
        job = asdict(self)
        if self.subset is None:
            del job["subset"]
        else:
            job["subset"] = list(self.subset)
        return job


class VllmRunError(RuntimeError):
    """The vLLM worker failed; the message names the cause and the log."""


def run_offline(
    python: str | Path,
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    stop_token_ids: Sequence[int],
    log_file: str | Path,
    timeout_s: float = 3600.0,
    labels: Sequence[str] | None = None,
    temperature: float = 0.0,
    seed: int | None = None,
    passes: Sequence[Pass] = (),
    concurrency: int = 1,
    subset: Sequence[int] | None = None,
) -> VllmRun:
    """One prompt at a time (or ``concurrency`` in flight; over the prompts ``subset``
    lists, all when None), greedy unless ``temperature`` > 0 (then sampled; with ``seed``,
    prompt i with seed + i, so a run repeats); returns the worker's result, parsed (outputs,
    counters, tokens/s, ``vllm_patches``; with ``labels``, one per prompt, the counters
    summed per label too) with ``run_s``, the whole process's wall time. Each of
    ``passes`` decodes the prompts again on the same engine: ``result.passes[name]``."""
    log_path = Path(log_file)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    job: dict[str, Any] = {
        "llm": engine.llm_kwargs(),
        "prompts": [list(map(int, p)) for p in prompts],
        "max_tokens": int(max_tokens),
        "stop_token_ids": [int(t) for t in stop_token_ids],
        "temperature": float(temperature),
    }
    if seed is not None:
        job["seed"] = int(seed)
    if concurrency != 1:
        job["concurrency"] = int(concurrency)
    if subset is not None:
        job["subset"] = [int(i) for i in subset]
    if labels is not None:
        job["labels"] = list(labels)
    if passes:
        job["passes"] = [p.to_job() for p in passes]
    with tempfile.TemporaryDirectory(prefix="eagle3-vllm-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job), encoding="utf-8")
        cmd = [str(python), "-m", "eagle3_pipeline.serving.worker", str(job_path), str(out_path)]
        env_txt = " ".join(f"{k}={v}" for k, v in sorted(engine.env.items()))
        log.info(
            "vLLM (offline, log %s): %s LLM(%s)",
            log_path,
            env_txt,
            ", ".join(f"{k}={v!r}" for k, v in job["llm"].items()),
        )
        t0 = time.perf_counter()
        with open(log_path, "ab") as fh:
            start = fh.tell()
            try:
                proc = subprocess.run(
                    cmd,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    env=worker_env(engine.env),
                    timeout=timeout_s,
                )
            except subprocess.TimeoutExpired:
                raise VllmRunError(
                    f"vLLM worker did not finish in {timeout_s:.0f}s (log {log_path})"
                ) from None
        if proc.returncode != 0 or not out_path.is_file():
            with open(log_path, "rb") as fh:
                fh.seek(start)
                tail = fh.read()[-64 * 1024 :].decode("utf-8", errors="replace")
            raise VllmRunError(
                f"vLLM exited with {proc.returncode}: {cause(tail)} (log {log_path})"
            )
        result = json.loads(out_path.read_text(encoding="utf-8"))
    result["run_s"] = time.perf_counter() - t0
    try:
        return VllmRun.parse(result, f"the vLLM worker's result (log {log_path})")
    except VllmResultError as exc:
        raise VllmRunError(str(exc)) from None
