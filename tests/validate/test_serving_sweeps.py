"""Serving figures from vLLM's counters and clocks: the sampled pass per prompt set, the
speedup per number of requests in flight and where the draft stops paying, and how the
report shows them. Real vLLM runs them in tests/serving/test_vllm_real.py."""

from __future__ import annotations

import pytest

from eagle3_pipeline.serving.offline import Pass
from eagle3_pipeline.serving.result import GenerationPass
from eagle3_pipeline.validate.prompt_sets import EvalPrompt
from eagle3_pipeline.validate.sweeps import (
    concurrency_figures,
    concurrency_plan,
    draft_passes,
    sampled_figures,
)


def _counters(drafts: int, per_pos: list[int]) -> dict:
    return {
        "drafts": drafts,
        "draft_tokens": drafts * len(per_pos),
        "accepted": sum(per_pos),
        "accepted_per_pos": per_pos,
    }


def _run(
    tps: float,
    outputs: list[list[int]],
    counters: dict | None = None,
    groups: dict[str, dict] | None = None,
) -> GenerationPass:
    generated = sum(len(o) for o in outputs)
    return GenerationPass(
        outputs=outputs,
        generated_tokens=generated,
        wall_s=generated / tps,
        tokens_per_s=tps,
        counters=counters or {},
        group_counters=groups or {},
    )


def test_levels_above_the_prompts_decoded_are_skipped_and_one_is_the_single_stream():
    assert concurrency_plan([1, 4, 16], 24) == ([4, 16], [])
    assert concurrency_plan([16, 1, 4], 8) == ([4], [16])
    assert concurrency_plan([1], 3) == ([], [])


def test_the_draft_engine_samples_per_label_then_runs_each_level():
    passes = draft_passes(0.7, 5, [4, 16])
    assert [(p.name, p.temperature, p.seed, p.concurrency, p.labels) for p in passes] == [
        ("sampled", 0.7, 5, 1, True),
        ("c4", 0.0, None, 4, False),
        ("c16", 0.0, None, 16, False),
    ]
    assert [p.name for p in draft_passes(None, 5, [4])] == ["c4"]


def test_a_pass_names_its_concurrency_labels_and_subset_to_the_worker():
    job = Pass("x", concurrency=4, labels=True, subset=(0, 2)).to_job()
    assert (job["concurrency"], job["labels"], job["subset"]) == (4, True, [0, 2])
    assert "subset" not in Pass("y").to_job()  # every prompt


@pytest.mark.parametrize(
    ("prompts", "wanted", "subset"),
    [
        (10, None, None),
        (10, 10, None),
        (10, 40, None),
        (10, 4, (0, 2, 5, 7)),  # evenly spaced: every set and turn in proportion
        (3, 1, (0,)),
    ],
)
def test_the_speed_subset_is_evenly_spaced_through_the_prompts(prompts, wanted, subset):
    from eagle3_pipeline.validate.sweeps import speed_subset

    assert speed_subset(prompts, wanted) == subset


@pytest.mark.parametrize(
    ("speedups", "break_even"),
    [
        ((1.3, 1.1, 0.9, 0.8), 16),  # pays at 1 and 4, stops at 16
        ((1.3, 1.2, 1.05, 1.01), None),  # pays at every level measured
        ((0.9, 1.1, 0.95, 0.7), 1),  # never paid at one stream: the lowest level losing
    ],
)
def test_break_even_is_the_lowest_level_where_the_draft_no_longer_pays(speedups, break_even):
    levels = [1, 4, 16, 64]
    out = [[1, 2, 3]]
    base = {c: _run(100.0, out) for c in levels}
    with_draft = {
        c: _run(100.0 * s, out, _counters(10, [6, 3]))
        for c, s in zip(levels, speedups, strict=True)
    }
    fig = concurrency_figures(with_draft, base, skipped=[256])
    assert [r.concurrency for r in fig.levels] == levels
    assert [r.speedup for r in fig.levels] == pytest.approx(list(speedups))
    assert fig.break_even_concurrency == break_even
    assert fig.skipped == [256]
    assert fig.levels[0].acceptance_length == pytest.approx(1 + 9 / 10)
    keys = ["1", "4", "16", "64"]
    assert fig.speedup_by_concurrency() == pytest.approx(dict(zip(keys, speedups, strict=True)))


def test_different_batched_outputs_are_reported_not_judged():
    fig = concurrency_figures(
        {1: _run(10.0, [[1, 2]]), 4: _run(20.0, [[1, 3]])},
        {1: _run(10.0, [[1, 2]]), 4: _run(25.0, [[1, 2]])},
    )
    assert [r.same_outputs for r in fig.levels] == [True, False]
    assert fig.break_even_concurrency == 4


def test_sampled_acceptance_per_set_sums_that_sets_labels():
    prompts = [
        EvalPrompt(id="a", set="mt_bench", category="coding", turn=1, messages=[], prompt_ids=[1]),
        EvalPrompt(id="b", set="mt_bench", category="math", turn=2, messages=[], prompt_ids=[2]),
        EvalPrompt(id="c", set="humaneval", category=None, turn=1, messages=[], prompt_ids=[3]),
    ]
    groups = {
        prompts[0].group: _counters(10, [5, 2]),
        prompts[1].group: _counters(10, [3, 0]),
        prompts[2].group: _counters(4, [4, 4]),
    }
    run = _run(5.0, [[1], [2], [3]], _counters(24, [12, 6]), groups)
    s = sampled_figures(run, 0.7, 0, prompts)
    assert (s.temperature, s.seed) == (0.7, 0)
    assert s.mean_acceptance_length == pytest.approx(1 + 18 / 24)
    assert s.sets["mt_bench"].mean_acceptance_length == pytest.approx(1 + 10 / 20)
    assert s.sets["mt_bench"].per_position_rate == pytest.approx([0.4, 0.1])
    assert s.sets["humaneval"].mean_acceptance_length == pytest.approx(3.0)


def test_the_report_states_temperature_k_and_concurrency_and_draws_the_plot():
    from eagle3_pipeline.validate.acceptance import pool
    from eagle3_pipeline.validate.report_serving import concurrency_png, serving_lines
    from eagle3_pipeline.validate.vllm import compare

    out = [[1, 2, 3]]
    conc = concurrency_figures(
        {1: _run(12.0, out, _counters(10, [6])), 4: _run(30.0, out, _counters(10, [5]))},
        {1: _run(10.0, out), 4: _run(33.0, out)},
        skipped=[16],
    )
    prompt = EvalPrompt(id="a", set="mt_bench", category=None, turn=1, messages=[], prompt_ids=[1])
    run = _run(5.0, [[1], [2]], _counters(10, [5]), {prompt.group: _counters(10, [5])})
    sampled = sampled_figures(run, 0.7, 0, [prompt])
    v = compare(pool([], 1, 64), _run(12.0, out, _counters(10, [6])), _run(10.0, out), 1)
    v.sampled, v.concurrency = sampled, conc
    text = "\n".join(serving_lines(v, 1, 64))
    assert "temperature 0.7 (seed 0" in text and "K=1" in text
    assert "| mt_bench | **1.500** |" in text
    assert "| 4 | 33.0 | 30.0 | **0.91x** |" in text
    assert "stops paying at concurrency **4**" in text
    assert "Not measured: [16]" in text
    assert concurrency_png(conc, "t")[:4] == b"\x89PNG"
    assert "K=1, one request at a time" in text
    # a sampled pass run with requests in flight says so (validate.counting_concurrency)
    v.sampled = sampled_figures(run, 0.7, 0, [prompt], concurrency=8)
    v.speed_prompts, v.prompts = 1, 2  # the levels over a subset say so
    text = "\n".join(serving_lines(v, 1, 64))
    assert "K=1, 8 requests in flight, one prompt set, category and turn at a time" in text
    assert "over 1 of the 2 prompts decoded above, evenly spaced" in text


def test_the_per_set_table_says_how_many_requests_the_proof_had_in_flight():
    from eagle3_pipeline.validate.report import sets_lines

    assert "vLLM one request at a time (concurrency 1)" in sets_lines({}, 3, 128)[0]
    eight = sets_lines({}, 3, 128, proof_concurrency=8)[0]
    assert "vLLM 8 requests in flight, one prompt set" in eight
    assert "one request at a time" not in eight
