"""Acceptance as vLLM itself measures it: serve the target with the draft, send the
held-out prompts, read vLLM's speculative-decoding counters.

Why beside our own measurement: our decoder (``acceptance.py``) proves what the draft
buys in principle; vLLM proves the published checkpoint is loaded and used the same way
at serve time (right aux layers, right ``norm_before_residual``, every tensor present).
The two figures agreeing is the evidence; disagreeing points at a loading problem.

vLLM (0.33) exports Prometheus counters on ``/metrics``:
``vllm:spec_decode_num_drafts``, ``vllm:spec_decode_num_draft_tokens``,
``vllm:spec_decode_num_accepted_tokens`` and ``vllm:spec_decode_num_accepted_tokens_per_pos``
(label ``position``), each with the ``_total`` suffix that prometheus_client gives
counters. Mean acceptance length = 1 + accepted / drafts. The counters are cumulative
since the server started, so the figures are the difference of two scrapes.

Only :func:`run_vllm_validation` needs vLLM and a GPU; command construction and the
metrics client are plain Python and tested on CPU.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .vllm_server import VllmServer

log = logging.getLogger(__name__)

COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted": "vllm:spec_decode_num_accepted_tokens",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
SHUTDOWN_TIMEOUT_S = 60.0  # SIGTERM to SIGKILL


class VllmError(RuntimeError):
    """The server did not start, died, or answered something unusable."""


# --------------------------------------------------------------------------- command


def speculative_config(draft_dir: str | Path, k: int) -> str:
    return json.dumps(
        {"method": "eagle3", "model": str(Path(draft_dir).resolve()),
         "num_speculative_tokens": int(k)},
        separators=(",", ":"),
    )


def serve_command(
    target: str,
    draft_dir: str | Path,
    k: int,
    *,
    port: int,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    data_parallel_size: int = 1,
    enable_expert_parallel: bool = False,
    gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
    served_model_name: str = "target",
    extra_args: Sequence[str] = (),
    executable: Sequence[str] = ("vllm",),
) -> list[str]:
    """``vllm serve TARGET --speculative-config {...}`` as an argv list (no shell)."""
    if k < 1:
        raise ValueError(f"num_speculative_tokens={k} must be >= 1")
    cmd = [*executable, "serve", str(target),
           "--speculative-config", speculative_config(draft_dir, k),
           "--host", "127.0.0.1", "--port", str(int(port)),
           "--served-model-name", served_model_name,
           "--tensor-parallel-size", str(tensor_parallel_size),
           "--gpu-memory-utilization", str(gpu_memory_utilization)]
    if pipeline_parallel_size > 1:
        cmd += ["--pipeline-parallel-size", str(pipeline_parallel_size)]
    if data_parallel_size > 1:
        cmd += ["--data-parallel-size", str(data_parallel_size)]
    if enable_expert_parallel:
        cmd.append("--enable-expert-parallel")
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    if revision:
        cmd += ["--revision", revision]
    if trust_remote_code:
        cmd.append("--trust-remote-code")
    # vLLM logs its own acceptance figures periodically; keep its stats on
    return cmd + list(extra_args)


# --------------------------------------------------------------------------- metrics


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples of a Prometheus text exposition: name -> [(labels, value)]."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        labels: dict[str, str] = {}
        if "{" in line:
            name, rest = line.split("{", 1)
            body, _, tail = rest.rpartition("}")
            labels = _parse_labels(body)
        else:
            name, _, tail = line.partition(" ")
        parts = tail.split()
        if not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        out.setdefault(name.strip(), []).append((labels, value))
    return out


def _parse_labels(body: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    i, n = 0, len(body)
    while i < n:
        eq = body.find("=", i)
        if eq < 0:
            break
        key = body[i:eq].strip().lstrip(",").strip()
        j = body.find('"', eq) + 1
        val = []
        while j < n and body[j] != '"':
            if body[j] == "\\" and j + 1 < n:
                j += 1
                val.append({"n": "\n"}.get(body[j], body[j]))
            else:
                val.append(body[j])
            j += 1
        labels[key] = "".join(val)
        i = j + 1
    return labels


def _total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float | None:
    for candidate in (f"{name}_total", name):
        if candidate in samples:
            return sum(v for _, v in samples[candidate])
    return None


@dataclass
class SpecDecodeCounters:
    drafts: float
    draft_tokens: float
    accepted: float
    accepted_per_pos: list[float]

    def minus(self, other: SpecDecodeCounters) -> SpecDecodeCounters:
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        a = self.accepted_per_pos + [0.0] * (n - len(self.accepted_per_pos))
        b = other.accepted_per_pos + [0.0] * (n - len(other.accepted_per_pos))
        return SpecDecodeCounters(self.drafts - other.drafts,
                                  self.draft_tokens - other.draft_tokens,
                                  self.accepted - other.accepted,
                                  [x - y for x, y in zip(a, b, strict=True)])

    def figures(self) -> dict[str, Any]:
        """vLLM's mean acceptance length (1 + accepted / drafts) and per-position rates."""
        d = self.drafts
        return {
            "num_drafts": int(self.drafts),
            "num_draft_tokens": int(self.draft_tokens),
            "num_accepted_tokens": int(self.accepted),
            "num_accepted_tokens_per_pos": [int(x) for x in self.accepted_per_pos],
            "mean_acceptance_length": 1 + self.accepted / d if d else None,
            "per_position_rate": [x / d if d else None for x in self.accepted_per_pos],
            "draft_acceptance_rate": (self.accepted / self.draft_tokens
                                      if self.draft_tokens else None),
        }


def spec_decode_counters(text: str) -> SpecDecodeCounters:
    """The spec-decode counters of one ``/metrics`` scrape, summed over label sets
    (engines, model names); missing counters mean speculative decoding is not active."""
    samples = parse_prometheus(text)
    values = {key: _total(samples, name) for key, name in COUNTERS.items()}
    missing = [COUNTERS[k] for k, v in values.items() if v is None]
    if missing:
        raise VllmError(f"/metrics has no {', '.join(missing)}: is speculative decoding on?")
    per_pos: dict[int, float] = {}
    for candidate in (f"{PER_POS}_total", PER_POS):
        for labels, value in samples.get(candidate, []):
            if "position" in labels:
                pos = int(labels["position"])
                per_pos[pos] = per_pos.get(pos, 0.0) + value
        if per_pos:
            break
    ordered = [per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)] if per_pos else []
    return SpecDecodeCounters(values["drafts"] or 0.0, values["draft_tokens"] or 0.0,
                              values["accepted"] or 0.0, ordered)


def fetch_text(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (localhost)
        return resp.read().decode("utf-8")


def scrape(base_url: str, timeout: float = 10.0) -> SpecDecodeCounters:
    return spec_decode_counters(fetch_text(f"{base_url.rstrip('/')}/metrics", timeout))


def post_json(url: str, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(payload).encode("utf-8"),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (localhost)
        return json.loads(resp.read().decode("utf-8"))


def complete(base_url: str, model: str, prompt_ids: Sequence[int], max_tokens: int,
             timeout: float = 600.0) -> list[int] | None:
    """One greedy completion of a token-id prompt; returns the token ids when given."""
    payload = {"model": model, "prompt": list(prompt_ids), "max_tokens": int(max_tokens),
               "temperature": 0.0, "return_token_ids": True}
    out = post_json(f"{base_url.rstrip('/')}/v1/completions", payload, timeout)
    choice = (out.get("choices") or [{}])[0]
    ids = choice.get("token_ids")
    return list(ids) if isinstance(ids, list) else None


# --------------------------------------------------------------------------- the server


def run_vllm_validation(
    cmd: Sequence[str],
    port: int,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    log_file: str | Path,
    served_model_name: str = "target",
    concurrency: int = 8,
    startup_timeout_s: float = 1800.0,
) -> dict[str, Any]:
    """Start the server, scrape, send every prompt (greedy), scrape again; the delta."""
    log.info("starting: %s (log: %s)", " ".join(cmd), log_file)
    # VllmError, not StageError: the stage reports it as "vLLM validation failed"
    server = VllmServer(cmd, port, log_file, startup_timeout_s, SHUTDOWN_TIMEOUT_S,
                        timeout_key="validate.vllm_startup_timeout_s", error=VllmError)
    with server:
        before = scrape(server.url)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            outs = list(pool.map(
                lambda ids: complete(server.url, served_model_name, ids, max_new_tokens),
                prompts))
        wall = time.perf_counter() - t0
        after = scrape(server.url)
    figures = after.minus(before).figures()
    figures.update({
        "prompts": len(prompts),
        "generated_tokens": sum(len(o) for o in outs if o) if all(outs) else None,
        "wall_s": wall,
        "command": " ".join(cmd),
        "completions": [o for o in outs],
    })
    return figures
