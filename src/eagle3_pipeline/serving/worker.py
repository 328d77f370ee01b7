"""Generation in one offline vLLM engine, run inside the vLLM environment.

``python -m eagle3_pipeline.serving.worker JOB.json OUT.json`` (the vLLM environment's
interpreter; :mod:`eagle3_pipeline.serving.offline` writes the job and reads the result).
It imports only the standard library, vLLM, :mod:`eagle3_pipeline.serving.counters` and
:mod:`eagle3_pipeline.compat.vllm_expand` (for its record), so it runs where speculators
and the training torch are not installed.

The job holds an :class:`~eagle3_pipeline.serving.engine.Engine` as ``vllm.LLM`` keyword
arguments, the prompts (token ids), ``max_tokens`` and the stop token ids, and optionally
``temperature`` (default 0.0: greedy, what validation measures) and ``seed`` (prompt i is
sampled with seed + i: a sampled run repeats, and the prompts do not share one random
stream, which would make them all draw alike, e.g. all end at once). Prompts are
generated one at a time (a single stream: the latency a user of one chat sees, and what
the speculative-decoding speedup is defined on) after one warm-up request. The result
holds each prompt's output token ids, the wall time, and the difference of vLLM's own
``vllm:spec_decode_*`` counters (``LLM.get_metrics()``) over the timed requests. With
``labels`` (one per prompt: its prompt set, category and turn) the counters are also read
after every prompt and summed per label (``group_counters``), so each prompt set and
category gets vLLM's own figures from one engine. ``passes`` (optional) decode the same
prompts again on the same engine (an engine load costs more than a pass on a CPU), each
``{"name", "temperature", "seed", "concurrency", "labels": bool, "subset"}``: one prompt
at a time or ``concurrency`` requests in flight (with ``labels``, one label's prompts at a
time, the counters read between labels), over the prompts ``subset`` lists (all when
absent); each comes back under ``passes[name]`` with its own outputs, tokens/s and
counters. The main pass takes ``concurrency`` and ``subset`` from the job the same way
(default: every prompt, one at a time). ``vllm_patches`` lists the patches our
vLLM plugins applied (:mod:`eagle3_pipeline.compat.vllm_expand`), as this process recorded
them when ``LLM`` loaded the plugins.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any

from eagle3_pipeline.compat import vllm_expand
from eagle3_pipeline.serving.counters import (
    COUNTERS,
    PER_POS,
    add_counters,
    by_label,
    counter_delta,
    generation_run,
)


def counters(metrics: list[Any]) -> dict[str, Any]:
    """Spec-decode counters summed over engines; empty when speculation is off."""
    out: dict[str, Any] = {}
    per_pos: list[int] = []
    for m in metrics:
        if m.name in COUNTERS:
            key = COUNTERS[m.name]
            out[key] = out.get(key, 0) + int(m.value)
        elif m.name == PER_POS:
            for i, value in enumerate(m.values):
                if i == len(per_pos):
                    per_pos.append(0)
                per_pos[i] += int(value)
    if out:
        out["accepted_per_pos"] = per_pos
    return out


def sampling(job: dict[str, Any], spec: dict[str, Any], n: int) -> list[Any]:
    """One ``SamplingParams`` per prompt: greedy unless ``temperature`` > 0; with ``seed``,
    prompt i is sampled with seed + i."""
    from vllm import SamplingParams

    seed = spec.get("seed")
    return [
        SamplingParams(
            temperature=float(spec.get("temperature", 0.0)),
            seed=None if seed is None else int(seed) + i,
            max_tokens=int(job["max_tokens"]),
            stop_token_ids=list(job["stop_token_ids"]),
            detokenize=False,
        )
        for i in range(n)
    ]


def one_at_a_time(
    llm: Any, prompts: list[Any], params: list[Any], labels: list[str] | None
) -> dict[str, Any]:
    """Each prompt alone (a single stream); with ``labels`` the counters are read after
    every prompt and summed per label (reading time is not generation time)."""
    before = last = counters(llm.get_metrics())
    outputs: list[list[int]] = []
    latencies: list[float] = []
    groups: dict[str, dict[str, Any]] = {}
    reading = 0.0
    g0 = time.perf_counter()
    for i, prompt in enumerate(prompts):
        s0 = time.perf_counter()
        res = llm.generate([prompt], params[i], use_tqdm=False)
        latencies.append(time.perf_counter() - s0)
        outputs.append([int(t) for t in res[0].outputs[0].token_ids])
        if labels is not None:
            m0 = time.perf_counter()
            now = counters(llm.get_metrics())
            groups[labels[i]] = add_counters(groups.get(labels[i], {}), counter_delta(now, last))
            last = now
            reading += time.perf_counter() - m0
    wall = time.perf_counter() - g0 - reading
    extra = {"group_counters": groups} if labels is not None else {}
    return generation_run(
        outputs, wall, counters(llm.get_metrics()), before, latencies_s=latencies, **extra
    )


def in_flight(
    llm: Any,
    prompts: list[Any],
    params: list[Any],
    concurrency: int,
    labels: list[str] | None = None,
) -> dict[str, Any]:
    """``concurrency`` requests in flight until the prompts run out: a new one is added as
    soon as one finishes, as a server under that many concurrent users sees them (what
    ``vllm bench serve --max-concurrency`` measures). The engine's own step loop
    (``LLMEngine.add_request``/``step``), so no HTTP cost is timed. With ``labels`` the
    prompts of one label run together (at most ``concurrency`` of them in flight) and the
    counters are read between labels (``group_counters``), as the served path does: vLLM's
    counters are the engine's, so a label's share is only known when it runs alone."""
    if labels is None:
        return _in_flight(llm, prompts, params, concurrency)
    order = by_label(labels)
    outputs: list[list[int]] = [[] for _ in prompts]
    groups: dict[str, dict[str, Any]] = {}
    before = counters(llm.get_metrics())
    wall = 0.0
    for label, idx in order.items():
        run = _in_flight(llm, [prompts[i] for i in idx], [params[i] for i in idx], concurrency)
        for i, out in zip(idx, run["outputs"], strict=True):
            outputs[i] = out
        groups[label] = run["counters"]
        wall += run["wall_s"]
    return generation_run(
        outputs,
        wall,
        counters(llm.get_metrics()),
        before,
        concurrency=concurrency,
        group_counters=groups,
    )


def _in_flight(llm: Any, prompts: list[Any], params: list[Any], concurrency: int) -> dict[str, Any]:
    engine = llm.llm_engine
    tag = f"c{concurrency}-{time.monotonic_ns()}-"
    outputs: list[list[int] | None] = [None] * len(prompts)
    before = counters(llm.get_metrics())
    nxt = running = 0
    g0 = time.perf_counter()
    while nxt < len(prompts) or running:
        while running < concurrency and nxt < len(prompts):
            engine.add_request(f"{tag}{nxt}", prompts[nxt], params[nxt])
            nxt += 1
            running += 1
        for out in engine.step():
            # our id (vLLM may report it with its own uniqueness suffix appended)
            mine = re.match(re.escape(tag) + r"(\d+)", str(out.request_id))
            if out.finished and mine:
                outputs[int(mine.group(1))] = [int(t) for t in out.outputs[0].token_ids]
                running -= 1
    wall = time.perf_counter() - g0
    if any(o is None for o in outputs):
        raise RuntimeError(f"concurrency {concurrency}: a request finished without its output")
    done = [o for o in outputs if o is not None]
    return generation_run(done, wall, counters(llm.get_metrics()), before, concurrency=concurrency)


def decode(
    llm: Any,
    prompts: list[Any],
    params: list[Any],
    spec: dict[str, Any],
    labels: list[str] | None,
) -> dict[str, Any]:
    """One pass as ``spec`` asks: over ``spec["subset"]`` (prompt indices; all when absent),
    one request at a time or ``spec["concurrency"]`` in flight, counters per label with
    ``labels``. A subset's outputs come back in the subset's order."""
    subset = spec.get("subset")
    if subset is not None:
        prompts = [prompts[i] for i in subset]
        params = [params[i] for i in subset]
        labels = None if labels is None else [labels[i] for i in subset]
    c = int(spec.get("concurrency", 1))
    if c == 1:
        return one_at_a_time(llm, prompts, params, labels)
    return in_flight(llm, prompts, params, c, labels)


def run(job: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams

    import_s = time.perf_counter() - t0
    os.environ.pop(vllm_expand.RECORD_VAR, None)  # recorded afresh by this LLM's plugins
    llm = LLM(**job["llm"])
    load_s = time.perf_counter() - t0 - import_s
    prompts = [{"prompt_token_ids": list(p)} for p in job["prompts"]]
    if prompts:  # warm-up: first-request costs are not the draft's
        llm.generate(
            prompts[:1],
            SamplingParams(temperature=0.0, max_tokens=4, detokenize=False),
            use_tqdm=False,
        )
    labels: list[str] | None = job.get("labels")
    result = decode(llm, prompts, sampling(job, job, len(prompts)), job, labels)
    passes: dict[str, Any] = {}
    for spec in job.get("passes", []):  # the same engine: no second load
        params = sampling(job, spec, len(prompts))
        passes[spec["name"]] = decode(
            llm, prompts, params, spec, labels if spec.get("labels") else None
        )
    return {
        **result,
        "import_s": import_s,
        "load_s": load_s,
        "env": {k: v for k, v in os.environ.items() if k.startswith("VLLM_")},
        "vllm_patches": vllm_expand.applied(),
        **({"passes": passes} if passes else {}),
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m eagle3_pipeline.serving.worker JOB.json OUT.json", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as fh:
        job = json.load(fh)
    result = run(job)
    tmp = args[1] + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    os.replace(tmp, args[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
