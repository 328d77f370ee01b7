"""The draft in real vLLM: acceptance from vLLM's own counters, losslessness, speedup.

Why beside our own decoder (``acceptance.py``): our decoder proves what the draft buys in
principle; vLLM proves the published checkpoint is loaded and used the same way at serve
time (right aux layers, right ``norm_before_residual``, every tensor present). On the
same prompts in float32 the two must give the same acceptance length; a difference
beyond float noise points at a loading problem and fails the stage with both figures.

Two engines run, one after the other, on the held-out prompts, one prompt at a time:
the target with the EAGLE-3 draft (K from the checkpoint or ``validate.k``) and the
target alone. From them come vLLM's acceptance length (1 + accepted / drafts) and
per-position rates, losslessness (greedy output with the draft equals output without it)
and the single-stream speedup (tokens/s with the draft over tokens/s without). Where the
precision a user serves in is not the proof's float32 (a real target on a CPU with native
bf16), a second pair in that precision gives the speedup (:mod:`.engines`).

Two ways to run an engine, with the same :class:`~eagle3_pipeline.serving.engine.Engine`:
``offline`` (``vllm.LLM`` in :mod:`eagle3_pipeline.serving.worker`, counters from
``LLM.get_metrics()``) and ``serve`` (``vllm serve``, the OpenAI client, counters from
``/metrics`` parsed by ``prometheus_client``). Their counters agree; a test holds that.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from eagle3_pipeline.serving.counters import (
    COUNTERS,
    PER_POS,
    by_label,
    counter_delta,
    generation_run,
)
from eagle3_pipeline.serving.engine import Engine
from eagle3_pipeline.serving.figures import acceptance_length, position_rates, speedup
from eagle3_pipeline.serving.offline import Pass
from eagle3_pipeline.serving.result import GenerationPass, VllmResultError, VllmRun
from eagle3_pipeline.serving.server import engine_server
from eagle3_pipeline.validate.acceptance import AcceptanceResult
from eagle3_pipeline.validate.record import (
    EnginePair,
    KSweepRow,
    ServingGreedy,
    VllmAcceptance,
    VllmFigures,
)

log = logging.getLogger(__name__)


class VllmError(RuntimeError):
    """The server did not start, died, or answered something unusable."""


# --------------------------------------------------------------------------- counters


def spec_decode_counters(text: str) -> dict[str, Any]:
    """The spec-decode counters of one ``/metrics`` scrape, summed over label sets
    (engines, model names); ``{}`` when speculative decoding is off."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Any] = {}
    per_pos: dict[int, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue  # counters only (not _created)
            name = sample.name[: -len("_total")]
            if name in COUNTERS:
                key = COUNTERS[name]
                out[key] = out.get(key, 0) + int(sample.value)
            elif name == PER_POS and "position" in sample.labels:
                pos = int(sample.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0) + int(sample.value)
    if out:
        out["accepted_per_pos"] = (
            [per_pos.get(i, 0) for i in range(max(per_pos) + 1)] if per_pos else []
        )
    return out


def acceptance_figures(c: dict[str, Any]) -> VllmAcceptance:
    """vLLM's mean acceptance length (1 + accepted / drafts) and per-position rates."""
    d = int(c.get("drafts", 0))
    per_pos = [int(x) for x in c.get("accepted_per_pos", [])]
    return VllmAcceptance(
        num_drafts=d,
        num_draft_tokens=int(c.get("draft_tokens", 0)),
        num_accepted_tokens=int(c.get("accepted", 0)),
        num_accepted_tokens_per_pos=per_pos,
        mean_acceptance_length=acceptance_length(int(c.get("accepted", 0)), d),
        per_position_rate=position_rates(per_pos, d),
    )


# --------------------------------------------------------------------------- serve


def _scrape(base_url: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(f"{base_url}/metrics", timeout=30) as resp:  # noqa: S310
        return spec_decode_counters(resp.read().decode("utf-8"))


def run_served(
    python: str | Path,
    engine: Engine,
    port: int,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    stop_token_ids: Sequence[int],
    log_file: str | Path,
    startup_timeout_s: float,
    shutdown_timeout_s: float,
    concurrency: int = 1,
    labels: Sequence[str] | None = None,
    passes: Sequence[Pass] = (),
    subset: Sequence[int] | None = None,
) -> VllmRun:
    """The same measurement as :mod:`eagle3_pipeline.serving.worker`, through ``vllm serve``.
    With ``labels`` (one per prompt) the prompts of one label run together, ``concurrency``
    at a time, and ``/metrics`` is read between labels: ``group_counters`` per label.
    ``passes`` decode the prompts again on the same server (``result.passes[name]``).
    ``subset`` (and a pass's own): the prompt indices decoded, in that order (None: all)."""
    from openai import OpenAI

    t0 = time.perf_counter()
    server = engine_server(
        engine,
        python,
        port,
        log_file,
        startup_timeout_s,
        shutdown_timeout_s,
        port_key="validate.server.port",
        error=VllmError,
    )
    with server:
        load_s = time.perf_counter() - t0
        client = OpenAI(
            base_url=f"{server.url}/v1", api_key=server.api_key, timeout=600.0, max_retries=0
        )

        def complete(ids: Sequence[int], temperature: float, seed: int | None) -> list[int]:
            out = client.completions.create(
                model=engine.served_model_name,
                prompt=list(ids),
                max_tokens=max_tokens,
                temperature=temperature,
                seed=seed,
                extra_body={
                    "return_token_ids": True,
                    "stop_token_ids": list(stop_token_ids),
                    "skip_special_tokens": False,
                },
            )
            tokens = (out.choices[0].model_extra or {}).get("token_ids")
            if not isinstance(tokens, list):
                raise VllmError("the server returned no token_ids (is this vLLM?)")
            return [int(t) for t in tokens]

        def one_pass(
            lab: Sequence[str] | None,
            width: int,
            temperature: float,
            seed: int | None,
            chosen: Sequence[int] | None,
        ) -> dict[str, Any]:
            picked = list(range(len(prompts))) if chosen is None else list(chosen)
            # j in order[label]: the position in this pass's outputs
            order = by_label(["" if lab is None else lab[i] for i in picked])
            outputs: list[list[int]] = [[] for _ in picked]
            groups: dict[str, dict[str, Any]] = {}
            before = last = _scrape(server.url)
            reading = 0.0  # scrapes between labels: not generation
            g0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=max(1, width)) as pool:
                for label, idx in order.items():
                    seeds = [None if seed is None else seed + picked[j] for j in idx]
                    outs = pool.map(
                        complete,
                        [prompts[picked[j]] for j in idx],
                        [temperature] * len(idx),
                        seeds,
                    )
                    for j, out in zip(idx, outs, strict=True):
                        outputs[j] = out
                    if lab is not None:
                        m0 = time.perf_counter()
                        now = _scrape(server.url)
                        groups[label] = counter_delta(now, last)
                        last = now
                        reading += time.perf_counter() - m0
            wall = time.perf_counter() - g0 - reading
            extra = {"group_counters": groups} if lab is not None else {}
            return generation_run(outputs, wall, _scrape(server.url), before, **extra)

        if prompts:  # warm-up: first-request costs are not the draft's
            client.completions.create(
                model=engine.served_model_name,
                prompt=list(prompts[0]),
                max_tokens=4,
                temperature=0.0,
            )
        result = one_pass(labels, concurrency, 0.0, None, subset)
        done = {
            p.name: one_pass(
                labels if p.labels else None,
                p.concurrency,
                p.temperature,
                p.seed,
                p.subset,
            )
            for p in passes
        }
    if done:
        result["passes"] = {
            name: {**run, **({"concurrency": p.concurrency} if p.concurrency > 1 else {})}
            for p, (name, run) in zip(passes, done.items(), strict=True)
        }
    result = {**result, "load_s": load_s, "run_s": time.perf_counter() - t0}
    try:
        return VllmRun.parse(result, f"the vLLM server's results (log {log_file})")
    except VllmResultError as exc:
        raise VllmError(str(exc)) from None


# --------------------------------------------------------------------------- verdict


def differing(draft_run: GenerationPass, plain_run: GenerationPass) -> list[int]:
    """The prompts whose greedy output with the draft is not the output without it."""
    return [
        i
        for i, (a, b) in enumerate(zip(draft_run.outputs, plain_run.outputs, strict=True))
        if a != b
    ]


def compare(
    ours: AcceptanceResult,
    draft_run: GenerationPass,
    plain_run: GenerationPass,
    k: int,
    speed: tuple[GenerationPass, GenerationPass] | None = None,
    load_s: EnginePair | None = None,
) -> VllmFigures:
    """vLLM's figures beside ours: acceptance, losslessness (from the proof's runs
    ``draft_run``/``plain_run``), speedup (from ``speed``'s passes, with and without the
    draft, where the speed has engines of its own: validate/engines.py; else the proof's);
    ``load_s``: the speed engines' start times."""
    if not draft_run.counters:
        raise VllmError("vLLM reported no spec-decode counters: the draft was not used")
    fig = acceptance_figures(draft_run.counters)
    mismatched = differing(draft_run, plain_run)
    ours_len = ours.vllm_style_acceptance_length
    vllm_len = fig.mean_acceptance_length
    speed_d, speed_p = speed or (draft_run, plain_run)
    tps_d, tps_p = speed_d.tokens_per_s, speed_p.tokens_per_s
    return VllmFigures(
        **vars(fig),
        k=k,
        ours_acceptance_length=ours_len,
        ours_accepted_per_pos=list(ours.accepted_per_pos),
        ours_verification_steps=ours.steps,
        acceptance_length_diff=(
            None if ours_len is None or vllm_len is None else vllm_len - ours_len
        ),
        lossless=not mismatched,
        lossless_prompts=len(draft_run.outputs) - len(mismatched),
        prompts=len(draft_run.outputs),
        differing_prompts=mismatched,
        generated_tokens=draft_run.generated_tokens,
        tokens_per_s_with_draft=tps_d,
        tokens_per_s_without_draft=tps_p,
        speedup=speedup(tps_d, tps_p),
        engine_load_s=load_s or EnginePair(None, None),
        # the generation passes the tokens/s are measured over (engine load excluded)
        wall_s=EnginePair(speed_d.wall_s, speed_p.wall_s),
    )


def serving_greedy(draft_run: GenerationPass, plain_run: GenerationPass) -> ServingGreedy:
    """The serving pair's greedy single stream (its own precision): vLLM's acceptance and
    losslessness there, reported beside the proof's, never judged."""
    if not draft_run.counters:
        raise VllmError("vLLM reported no spec-decode counters: the draft was not used")
    mismatched = differing(draft_run, plain_run)
    return ServingGreedy(
        **vars(acceptance_figures(draft_run.counters)),
        lossless=not mismatched,
        lossless_prompts=len(draft_run.outputs) - len(mismatched),
        generated_tokens=draft_run.generated_tokens,
    )


def k_sweep_figures(
    runs: dict[int, GenerationPass], plain_run: GenerationPass
) -> tuple[list[KSweepRow], KSweepRow | None]:
    """Per K: vLLM's acceptance length, single-stream tokens/s and speedup over the same
    run without the draft; and the row of the K with the best speedup (``validate.k_sweep``)."""
    base = plain_run.tokens_per_s
    rows = []
    for k, run in sorted(runs.items()):
        fig = acceptance_figures(run.counters)
        tps = run.tokens_per_s
        rows.append(
            KSweepRow(
                k=k,
                acceptance_length=fig.mean_acceptance_length,
                per_position_rate=fig.per_position_rate,
                tokens_per_s=tps,
                speedup=speedup(tps, base),
                lossless=run.outputs == plain_run.outputs,
            )
        )
    best = max(
        (r for r in rows if r.speedup is not None), key=lambda r: r.speedup or 0.0, default=None
    )
    return rows, best
