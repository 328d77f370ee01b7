"""Which vLLM engines validate starts, in which precision, and which figures each gives:
the proof (counters, losslessness) in float32 on a CPU, the speed (tokens/s, concurrency,
K sweep, sampled) in the precision the run resolved for the target. Each precision is
stated (preflight's file written by the test), never read from the machine running it;
vLLM itself is a fake here (tests/serving/test_vllm_bf16.py serves the real one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from target_samples import LLAMA, target_spec

from eagle3_pipeline.core.config import load_config
from eagle3_pipeline.runtime.precision import Precision, write_precision
from eagle3_pipeline.serving.result import VllmRun
from eagle3_pipeline.validate.engines import pair, plan_engines, split
from eagle3_pipeline.validate.view import ValidateInputs

REPO = Path(__file__).resolve().parents[2]
F32 = Precision("float32", "float32 on a CPU, where vLLM and our evaluator agree exactly")
BF16 = Precision("bfloat16", "a real target on a CPU that computes bf16 natively")


def _inputs(tmp_path: Path, chosen: Precision | None, *overrides: str) -> ValidateInputs:
    """The validate stage's view, with preflight's choice stated in its file."""
    path = tmp_path / "precision.json"
    if chosen is not None:
        write_precision(path, chosen)
    cfg = load_config([*overrides, f"paths.precision={path}"], conf_dir=REPO / "conf")
    return ValidateInputs.from_config(cfg)


# --------------------------------------------------------------------------- precisions


def test_a_real_target_on_a_bf16_cpu_proves_in_float32_and_is_timed_in_bf16(tmp_path):
    v = _inputs(tmp_path, BF16, "model=smollm2_135m")
    assert v.precision()[1] == F32
    assert v.serving_precision() == BF16  # preflight's choice and its reason
    assert split(v.precision()[1], v.serving_precision())


@pytest.mark.parametrize(
    ("chosen", "overrides", "serving"),
    [
        # the tiny target: float32 whatever the CPU (preflight's rule), one pair
        (Precision("float32", "a tiny target built here stays float32"), [], "float32"),
        # a real target on a CPU without native bf16
        (Precision("float32", "a real target on a CPU without native bf16"), [], "float32"),
        # validate.dtype names both the proof's and the speed's
        (BF16, ["validate.dtype=bfloat16"], "bfloat16"),
        (BF16, ["validate.dtype=float32"], "float32"),
    ],
)
def test_one_precision_for_both_where_nothing_differs(tmp_path, chosen, overrides, serving):
    model = [] if "tiny" in chosen.why else ["model=smollm2_135m"]
    v = _inputs(tmp_path, chosen, *model, *overrides)
    assert v.serving_precision().dtype == v.precision()[1].dtype == serving
    assert not split(v.precision()[1], v.serving_precision())


def test_model_dtype_is_the_speeds_precision_and_preflights_file_is_not_read(tmp_path):
    v = _inputs(tmp_path, None, "model=smollm2_135m", "model.dtype=float16")
    assert v.serving_precision() == Precision("float16", "model.dtype=float16 (set)")
    assert v.precision()[1] == F32


def test_off_cpu_the_proof_is_the_targets_precision_and_one_pair_serves(tmp_path):
    v = _inputs(tmp_path, BF16, "model=smollm2_135m", "validate.device=cuda")
    assert v.precision() == ("cuda", BF16) and v.serving_precision() == BF16


# --------------------------------------------------------------------------- the plan


def _plan(proof: Precision, serving: Precision) -> list[tuple[str, bool, str, bool, bool, list]]:
    plans = plan_engines(proof, serving, 0.7, 5, [4])
    return [(p.name, p.draft, p.dtype, p.proof, p.speed, [q.name for q in p.passes]) for p in plans]


def test_equal_precisions_give_one_pair_that_decodes_every_pass_as_before():
    same = Precision("float32", "a tiny target built here stays float32")
    # the reasons differ, the dtype is one: one pair
    assert _plan(F32, same) == [
        ("with_draft", True, "float32", True, True, ["sampled", "c4"]),
        ("without_draft", False, "float32", True, True, ["c4"]),
    ]


def test_different_precisions_give_a_proof_pair_and_a_serving_pair():
    assert _plan(F32, BF16) == [
        # the proof: the greedy single stream alone
        ("with_draft", True, "float32", True, False, []),
        ("without_draft", False, "float32", True, False, []),
        # the speed: the single stream, the sampled pass and every level
        ("serving_with_draft", True, "bfloat16", False, True, ["sampled", "c4"]),
        ("serving_without_draft", False, "bfloat16", False, True, ["c4"]),
    ]
    plans = plan_engines(F32, BF16, None, 5, [])
    assert [p.name for p in pair(plans, speed=False)] == ["with_draft", "without_draft"]
    assert [p.name for p in pair(plans, speed=True)] == [
        "serving_with_draft",
        "serving_without_draft",
    ]
    assert pair(plans, speed=True)[0].precision == BF16  # the reason travels with it


# --------------------------------------------------------------------------- measure_vllm


def _counters(drafts: int, accepted: int) -> dict[str, Any]:
    return {
        "drafts": drafts,
        "draft_tokens": 2 * drafts,
        "accepted": accepted,
        "accepted_per_pos": [accepted, 0],
    }


class FakeVllm:
    """``run_offline`` without vLLM: each engine's runs answer from its precision (float32:
    1.2x, acceptance 1.6, lossless; bfloat16: 1.5x, acceptance 1.4, one prompt's output
    changed by the draft) and every call is recorded."""

    TPS = {("float32", True): 12.0, ("float32", False): 10.0}
    TPS |= {("bfloat16", True): 30.0, ("bfloat16", False): 20.0}

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int | None, list[str]]] = []
        # per engine: its main pass's (concurrency, subset), and each pass's
        # (name, concurrency, subset, labels)
        self.shapes: list[tuple[Any, ...]] = []

    def __call__(self, python, engine, prompts, max_tokens, stops, log_path, **kw) -> VllmRun:
        spec = engine.speculative_config
        k = spec.num_speculative_tokens if spec else None
        passes = list(kw.get("passes") or ())
        self.calls.append((log_path.name, engine.dtype, k, [p.name for p in passes]))
        self.shapes.append(
            (
                log_path.name[14:-4],
                kw.get("concurrency", 1),
                kw.get("subset"),
                [(p.name, p.concurrency, p.subset, p.labels) for p in passes],
            )
        )

        def one(tps: float, subset: Any = None) -> dict[str, Any]:
            n = len(prompts) if subset is None else len(subset)
            outputs = [[1, 2, 3] for _ in range(n)]
            counters = {}
            if spec:
                counters = _counters(10, 6 if engine.dtype == "float32" else 4)
                if engine.dtype == "bfloat16":
                    outputs[0] = [1, 2, 4]
            return {
                "outputs": outputs,
                "counters": counters,
                "generated_tokens": 3 * n,
                "tokens_per_s": tps,
                "wall_s": 3 * n / tps,
                "group_counters": {lab: counters for lab in kw.get("labels") or []},
            }

        tps = self.TPS[(engine.dtype, spec is not None)]
        run = {**one(tps, kw.get("subset")), "load_s": 1.0}
        if passes:
            run["passes"] = {p.name: one(tps * p.concurrency, p.subset) for p in passes}
        return VllmRun.parse(run, "the fake vLLM run")


def _measure(tmp_path: Path, monkeypatch, chosen: Precision, *overrides: str):
    fake, figures, groups = _measure_fake(tmp_path, monkeypatch, chosen, *overrides)
    return fake.calls, figures, groups


def _measure_fake(tmp_path: Path, monkeypatch, chosen: Precision, *overrides: str):
    from eagle3_pipeline.serving import env, offline
    from eagle3_pipeline.validate import run
    from eagle3_pipeline.validate.acceptance import pool
    from eagle3_pipeline.validate.prompt_sets import EvalPrompt

    fake = FakeVllm()
    monkeypatch.setattr(offline, "run_offline", fake)
    monkeypatch.setattr(env, "find_python", lambda _: "python")
    monkeypatch.setattr(run, "stop_token_ids", lambda _: [0])
    cfg = _inputs(
        tmp_path,
        chosen,
        "model=smollm2_135m",
        "validate.concurrency=[1,2]",
        "validate.temperature=0.7",
        f"vllm.log_dir={tmp_path / 'logs'}",
        *overrides,
    )
    spec = target_spec(**LLAMA, path=str(tmp_path / "target"), max_position_embeddings=2048)
    prompts = [
        EvalPrompt(id=f"p{i}", set="heldout", category=None, turn=1, messages=[], prompt_ids=[i])
        for i in range(3)
    ]
    ours = pool([], 2, 8)
    dtype = cfg.runtime()[1]
    figures, groups = run.measure_vllm(cfg, spec, tmp_path / "draft", prompts, 2, dtype, ours)
    return fake, figures, groups


def test_counting_passes_run_in_flight_per_label_and_speed_over_a_subset(tmp_path, monkeypatch):
    """validate.counting_concurrency: the float32 proof (engines of its own) and the
    sampled pass run 8 requests in flight, counters per label; validate.speed_prompts=2:
    the serving pair's single stream and levels decode 2 of the 3 prompts, evenly spaced."""
    fake, v, groups = _measure_fake(
        tmp_path,
        monkeypatch,
        BF16,
        "validate.counting_concurrency=8",
        "validate.speed_prompts=2",
    )
    assert fake.shapes == [
        ("with_draft", 8, None, []),
        ("without_draft", 8, None, []),
        ("serving_with_draft", 1, (0, 1), [("sampled", 8, None, True), ("c2", 2, (0, 1), False)]),
        ("serving_without_draft", 1, (0, 1), [("c2", 2, (0, 1), False)]),
    ]
    assert (v.proof_concurrency, v.speed_prompts, v.prompts) == (8, 2, 3)
    assert v.sampled is not None and v.sampled.concurrency == 8
    assert v.lossless_prompts == 3 and groups  # the proof still covers every prompt
    g = v.serving_greedy  # over the subset: its first prompt is the one the fake changes
    assert g is not None and (g.lossless_prompts, g.generated_tokens) == (1, 6)
    assert v.speedup == pytest.approx(1.5)


def test_one_pair_over_a_subset_times_a_single_stream_pass_of_its_own(tmp_path, monkeypatch):
    """Where one pair gives proof and speed, the main pass stays the proof over every
    prompt; the single-stream speed is a pass over the subset, so the proof only counts
    and runs validate.counting_concurrency requests in flight, as the sampled pass does."""
    chosen = Precision("float32", "a real target on a CPU without native bf16")
    fake, v, _ = _measure_fake(
        tmp_path,
        monkeypatch,
        chosen,
        "validate.counting_concurrency=4",
        "validate.speed_prompts=2",
    )
    assert fake.shapes == [
        (
            "with_draft",
            4,
            None,
            [("c1", 1, (0, 1), False), ("sampled", 4, None, True), ("c2", 2, (0, 1), False)],
        ),
        ("without_draft", 4, None, [("c1", 1, (0, 1), False), ("c2", 2, (0, 1), False)]),
    ]
    assert (v.proof_concurrency, v.speed_prompts) == (4, 2)
    assert v.speedup == pytest.approx(1.2) and v.engine_load_s.with_draft == 1.0
    assert v.concurrency is not None and v.concurrency.levels[0].generated_tokens == 6


def test_the_proof_pair_runs_the_greedy_stream_and_the_serving_pair_every_speed_figure(
    tmp_path, monkeypatch
):
    calls, v, groups = _measure(tmp_path, monkeypatch, BF16, "validate.k_sweep=[1,2]")
    assert calls == [
        ("vllm_validate_with_draft.log", "float32", 2, []),
        ("vllm_validate_without_draft.log", "float32", None, []),
        ("vllm_validate_serving_with_draft.log", "bfloat16", 2, ["sampled", "c2"]),
        ("vllm_validate_serving_without_draft.log", "bfloat16", None, ["c2"]),
        ("vllm_validate_k1.log", "bfloat16", 1, []),  # the K sweep in the serving precision
    ]
    # the proof: float32's counters and losslessness, per label too
    assert (v.dtype, v.mean_acceptance_length, v.lossless) == ("float32", 1.6, True)
    assert groups and all(c == _counters(10, 6) for c in groups.values())
    # the speed: bfloat16's engines, named with the reason preflight gave
    assert (v.serving_dtype, v.serving_dtype_why) == ("bfloat16", BF16.why)
    assert (v.tokens_per_s_with_draft, v.tokens_per_s_without_draft) == (30.0, 20.0)
    assert v.speedup == pytest.approx(1.5)
    assert v.wall_s.with_draft == pytest.approx(9 / 30.0)
    assert v.sampled is not None and v.sampled.mean_acceptance_length == pytest.approx(1.4)
    assert v.concurrency is not None
    assert [r.speedup for r in v.concurrency.levels] == [pytest.approx(1.5)] * 2
    assert v.k_sweep is not None and [r.k for r in v.k_sweep] == [1, 2]
    # bfloat16's own greedy figures: reported beside the proof, not judged
    g = v.serving_greedy
    assert g is not None and g.mean_acceptance_length == pytest.approx(1.4)
    assert (g.lossless, g.lossless_prompts, g.generated_tokens) == (False, 2, 9)
    # every engine's command, each with its own precision
    assert v.commands is not None and v.workarounds is not None
    assert list(v.commands) == list(v.workarounds) == [c[0][14:-4] for c in calls[:4]]
    assert all("--dtype float32" in v.commands[n] for n in ("with_draft", "without_draft"))
    assert all(
        "--dtype bfloat16" in v.commands[n] for n in ("serving_with_draft", "serving_without_draft")
    )


def test_one_precision_runs_one_pair_as_before(tmp_path, monkeypatch):
    chosen = Precision("float32", "a real target on a CPU without native bf16")
    calls, v, _ = _measure(tmp_path, monkeypatch, chosen)
    assert calls == [
        ("vllm_validate_with_draft.log", "float32", 2, ["sampled", "c2"]),
        ("vllm_validate_without_draft.log", "float32", None, ["c2"]),
    ]
    assert (v.dtype, v.serving_dtype, v.serving_dtype_why) == ("float32", "float32", chosen.why)
    assert v.serving_greedy is None and v.speedup == pytest.approx(1.2)
    assert v.commands is not None and list(v.commands) == ["with_draft", "without_draft"]


def test_the_report_names_the_precision_of_each_figure(tmp_path, monkeypatch):
    from eagle3_pipeline.validate.report import _vllm_lines
    from eagle3_pipeline.validate.report_serving import serving_lines

    _, v, _ = _measure(tmp_path, monkeypatch, BF16)
    text = "\n".join(_vllm_lines(v) + serving_lines(v, 2, 8))
    assert "(3/3 prompts, float32)" in text  # the proof's losslessness
    assert "**1.50x** (9 tokens, offline mode, bfloat16)" in text
    assert f"in **bfloat16** ({BF16.why})" in text and "on 2/3 prompts" in text
    assert "the proof's in float32" in text and "the speed's in bfloat16" in text
    assert "tokens, in bfloat16)" in text  # the sampled pass
    assert "temperature 0, in bfloat16, with N requests" in text
