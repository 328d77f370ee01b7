"""A vLLM run's result is parsed once where it enters this process: every figure reads
attributes, and a result without a key (a worker of another version) is one line naming
the source and the key."""

from __future__ import annotations

from typing import Any

import pytest

from eagle3_pipeline.serving.counters import generation_run
from eagle3_pipeline.serving.result import GenerationPass, VllmResultError, VllmRun

COUNTERS = {"drafts": 4, "draft_tokens": 12, "accepted": 6, "accepted_per_pos": [3, 2, 1]}


def _worker_result() -> dict[str, Any]:
    """What the offline worker writes (built by the same function it uses)."""
    main = generation_run([[1, 2], [3]], 0.5, COUNTERS, {}, latencies_s=[0.3, 0.2])
    sampled = generation_run([[4]], 0.25, COUNTERS, {}, group_counters={"mt_bench/1": COUNTERS})
    return {
        **main,
        "import_s": 2.0,
        "load_s": 9.5,
        "env": {"VLLM_CPU_KVCACHE_SPACE": "4"},
        "vllm_patches": ["expand"],
        "passes": {"sampled": {**sampled, "concurrency": 4}},
        "run_s": 20.0,
    }


def test_a_worker_result_reads_as_attributes() -> None:
    run = VllmRun.parse(_worker_result(), "out.json")
    assert run.outputs == [[1, 2], [3]] and run.generated_tokens == 3
    assert run.tokens_per_s == pytest.approx(6.0) and run.counters == COUNTERS
    assert run.latencies_s == [0.3, 0.2] and run.concurrency == 1
    assert (run.load_s, run.import_s, run.run_s) == (9.5, 2.0, 20.0)
    assert run.vllm_patches == ["expand"] and run.env == {"VLLM_CPU_KVCACHE_SPACE": "4"}
    sampled = run.passes["sampled"]
    assert isinstance(sampled, GenerationPass) and sampled.concurrency == 4
    assert sampled.group_counters == {"mt_bench/1": COUNTERS}
    assert sampled.tokens_per_s == pytest.approx(4.0)


def test_speculation_off_and_nothing_timed_are_values_not_errors() -> None:
    data = generation_run([], 0.0, {}, {})
    run = VllmRun.parse(data, "out.json")
    assert run.counters == {} and run.tokens_per_s is None and run.passes == {}
    assert run.load_s is None and run.vllm_patches is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("outputs"), "out.json: the vLLM run's result has no 'outputs'"),
        (lambda d: d.update(generated_tokens="3"), "'generated_tokens' is str, not int"),
        (lambda d: d.update(generated_tokens=True), "'generated_tokens' is bool, not int"),
        (
            lambda d: d["passes"]["sampled"].pop("counters"),
            "out.json, pass sampled: the vLLM run's result has no 'counters'",
        ),
        (lambda d: d.update(passes=[1]), "out.json: the vLLM run's 'passes' is not a mapping"),
    ],
)
def test_a_result_of_another_shape_is_one_line_naming_source_and_key(change, message) -> None:
    data = _worker_result()
    change(data)
    with pytest.raises(VllmResultError) as err:
        VllmRun.parse(data, "out.json")
    assert message in str(err.value) and "\n" not in str(err.value)
