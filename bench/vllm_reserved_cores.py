"""Benchmark: throughput of `vllm serve` (CPU build) under a regeneration-like load, with
vLLM's reserved scheduler core and without it.

Why: on x86 the CPU build keeps one core per rank for its engine-core (scheduler) process
(``VLLM_CPU_NUM_OF_RESERVED_CPU``, default one per rank), so on a 2-core machine the model
computes on one thread. Regeneration (the prepare stage's ``vllm serve``, many requests in
flight) is the largest cost of a real draft's data here; this measures what giving the
worker every core buys.

Each round starts one server per setting, alternating (load from other processes hits both
alike), sends a warm-up request, then ``--requests`` chat completions with ``--concurrency``
in flight, each exactly ``--max-tokens`` long (``ignore_eos``); it prints tokens/s per
round and the median of the paired ratios (none reserved / vLLM's default).

Usage (a target directory the pipeline wrote, e.g. data/target/model of a real run):

    python bench/vllm_reserved_cores.py --model data/target/model [--rounds 2]
        [--requests 64] [--concurrency 32] [--max-tokens 128] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eagle3_pipeline.serving.env import find_python, worker_env

SETTINGS = {"vllm default": None, "none reserved": "0"}
PROMPT = "Write a short story number {i} about a lighthouse keeper."


def _request(port: int, i: int, max_tokens: int) -> int:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": PROMPT.format(i=i)}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=900) as r:
        return int(json.loads(r.read())["usage"]["completion_tokens"])


def _wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"error: vllm serve exited with {proc.returncode} (see its log)")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                return
        except OSError:
            time.sleep(2)
    raise SystemExit(f"error: vllm serve did not start within {timeout_s:.0f} s")


def run_once(args: argparse.Namespace, reserved: str | None, log: Path) -> float:
    """Tokens/s of one server with ``reserved`` cores kept for the scheduler (None: vLLM's
    default)."""
    env = worker_env({"VLLM_CPU_KVCACHE_SPACE": "1"})
    env.pop("VLLM_CPU_NUM_OF_RESERVED_CPU", None)
    if reserved is not None:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = reserved
    vllm = Path(find_python()).parent / "vllm"
    cmd = [
        str(vllm), "serve", str(args.model), "--host", "127.0.0.1", "--port", str(args.port),
        "--served-model-name", "m", "--dtype", args.dtype, "--max-model-len", "4096",
        "--seed", "0", "--enforce-eager",
    ]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            _wait_healthy(args.port, proc, 600)
            _request(args.port, 0, 8)  # warm-up
            t = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                tokens = sum(
                    pool.map(
                        lambda i: _request(args.port, i, args.max_tokens), range(args.requests)
                    )
                )
            return tokens / (time.perf_counter() - t)
        finally:
            proc.terminate()
            proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", type=Path, required=True, help="a target directory (HF layout)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--port", type=int, default=8499)
    ap.add_argument("--logs", type=Path, default=Path("logs"), help="one log per server")
    args = ap.parse_args()
    if not (args.model / "config.json").is_file():
        sys.exit(f"error: {args.model}/config.json: not a model directory (pass --model)")
    args.logs.mkdir(parents=True, exist_ok=True)
    print(f"cpu: {os.cpu_count()} cores; model {args.model}; {args.requests} requests, "
          f"{args.concurrency} in flight, {args.max_tokens} tokens, {args.dtype}")  # fmt: skip
    ratios = []
    for r in range(args.rounds):
        figures = {}
        for name, reserved in SETTINGS.items():
            log = args.logs / f"bench_reserved_{reserved or 'default'}_{r}.log"
            figures[name] = run_once(args, reserved, log)
            print(f"round {r}: {name:14s} {figures[name]:7.1f} tokens/s", flush=True)
        ratios.append(figures["none reserved"] / figures["vllm default"])
    print(f"none reserved / vllm default: {statistics.median(ratios):.2f}x "
          f"(median of {len(ratios)} paired rounds)")  # fmt: skip


if __name__ == "__main__":
    main()
