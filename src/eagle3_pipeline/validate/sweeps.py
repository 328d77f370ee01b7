"""What a draft does under serving conditions, from vLLM alone: sampled acceptance and
the speedup per number of requests in flight.

Why beyond the greedy single stream: users sample (temperature > 0, where vLLM's
rejection sampler accepts a draft token with probability min(1, p/q) instead of on an
exact match) and serve many users at once, where the target's forward is already busy
with other sequences and the draft's extra tokens stop being free. A draft that pays at
one greedy stream can stop paying under load, so both are measured on the engines the
stage already loaded (:class:`~eagle3_pipeline.serving.offline.Pass`) and reported from
vLLM's counters and clocks. No figure here has one of ours beside it: sampled decoding
cannot be replayed outside vLLM token for token.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from eagle3_pipeline.serving.figures import speedup
from eagle3_pipeline.serving.offline import Pass
from eagle3_pipeline.serving.result import GenerationPass
from eagle3_pipeline.validate.by_set import vllm_by_set
from eagle3_pipeline.validate.prompt_sets import EvalPrompt
from eagle3_pipeline.validate.record import ConcurrencyFigures, ConcurrencyLevel, SampledFigures
from eagle3_pipeline.validate.vllm import acceptance_figures

log = logging.getLogger(__name__)

SAMPLED = "sampled"


def concurrency_plan(levels: Sequence[int], prompts: int) -> tuple[list[int], list[int]]:
    """``(measured, skipped)``: the levels above 1 with at least as many prompts as
    requests in flight (1 is the single-stream run itself), and those without."""
    above = sorted({c for c in levels if c > 1})
    return [c for c in above if c <= prompts], [c for c in above if c > prompts]


def level_name(c: int) -> str:
    return f"c{c}"


def speed_subset(prompts: int, wanted: int | None) -> tuple[int, ...] | None:
    """``validate.speed_prompts``: ``wanted`` prompt indices evenly spaced through the
    ``prompts`` decoded (first turns of each set, then second turns: every set and turn in
    proportion); None where that is all of them."""
    if wanted is None or wanted >= prompts:
        return None
    return tuple(sorted({(i * prompts) // wanted for i in range(wanted)}))


def draft_passes(
    temperature: float | None,
    seed: int,
    levels: Sequence[int],
    counting: int = 1,
    subset: tuple[int, ...] | None = None,
) -> list[Pass]:
    """The passes of the engine with the draft: sampled (per label, ``counting`` requests
    in flight), then each level (over ``subset``)."""
    out = (
        []
        if temperature is None
        else [Pass(SAMPLED, temperature, seed, concurrency=counting, labels=True)]
    )
    return out + baseline_passes(levels, subset)


def baseline_passes(levels: Sequence[int], subset: tuple[int, ...] | None = None) -> list[Pass]:
    """The target alone at each level, over ``subset`` (its single stream is its main run)."""
    return [Pass(level_name(c), concurrency=c, subset=subset) for c in levels]


def sampled_figures(
    run: GenerationPass,
    temperature: float,
    seed: int,
    prompts: Sequence[EvalPrompt],
    concurrency: int = 1,
) -> SampledFigures:
    """vLLM's acceptance at ``temperature``, pooled and per prompt set (the pass ran
    ``concurrency`` requests in flight, one label at a time)."""
    return SampledFigures(
        **vars(acceptance_figures(run.counters)),
        temperature=temperature,
        seed=seed,
        sets=vllm_by_set(prompts, run.group_counters),
        generated_tokens=run.generated_tokens,
        tokens_per_s=run.tokens_per_s,
        concurrency=concurrency,
    )


def concurrency_figures(
    with_draft: dict[int, GenerationPass],
    without_draft: dict[int, GenerationPass],
    skipped: Sequence[int] = (),
) -> ConcurrencyFigures:
    """Per level: output tokens/s with and without the draft, the speedup, vLLM's
    acceptance length at that level, and whether greedy outputs matched (batched float
    arithmetic may flip a near-tie: reported, not judged). ``break_even_concurrency``: the
    lowest level measured where the draft no longer pays (speedup < 1); None when it pays
    at every level measured."""
    rows = []
    for c in sorted(with_draft):
        d, b = with_draft[c], without_draft[c]
        tps_d, tps_b = d.tokens_per_s, b.tokens_per_s
        rows.append(
            ConcurrencyLevel(
                concurrency=c,
                tokens_per_s_with_draft=tps_d,
                tokens_per_s_without_draft=tps_b,
                speedup=speedup(tps_d, tps_b),
                acceptance_length=acceptance_figures(d.counters).mean_acceptance_length,
                same_outputs=d.outputs == b.outputs,
                generated_tokens=d.generated_tokens,
            )
        )
    losing = [r.concurrency for r in rows if r.speedup is not None and r.speedup < 1]
    return ConcurrencyFigures(
        levels=rows, break_even_concurrency=min(losing) if losing else None, skipped=list(skipped)
    )
