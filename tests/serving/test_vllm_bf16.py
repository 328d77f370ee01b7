"""The validate stage on a real target whose serving precision is bf16: the proof pair in
float32 (vLLM's counters equal ours, lossless) and a serving pair in bf16 that gives every
speed figure, in real vLLM (its CPU build).

SmolLM2-135M-Instruct (its GGUF converted by the target stage, in bf16: ``model.dtype``
set, so the test does not depend on the CPU running it), an untrained draft saved as the
train stage saves it, two held-out prompts, eight new tokens each, one level of two
requests in flight: four engine starts, the least that serves both pairs. The planning
itself (which engine runs which pass) is tested without vLLM in
tests/validate/test_engines.py. Asserted: behaviour, never wall time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BF16 = ["model=smollm2_135m", "model.dtype=bfloat16"]

pytestmark = pytest.mark.slow


def _gguf() -> Path:
    from eagle3_pipeline.core.config import load_config

    g = load_config(["model=smollm2_135m"], conf_dir=REPO / "conf").model.gguf
    assert g is not None
    path = REPO / g.path
    if not path.is_file():
        if os.environ.get("EAGLE3_REQUIRE_REAL_MODEL") == "1":
            pytest.fail(f"{path} is missing: run `eagle3-fetch smollm2_135m`")
        pytest.skip(f"{path} is missing: run `eagle3-fetch smollm2_135m`")
    return path


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory where the validate stage ran on SmolLM2 served in bf16."""
    from conftest import build_target_workdir
    from workdirs import make_workdir

    from eagle3_pipeline.stages.validate import main

    gguf = _gguf()
    target = build_target_workdir(
        tmp_path_factory.mktemp("smollm2_bf16"), *BF16, f"model.gguf.path={gguf}"
    )
    root = make_workdir(target, tmp_path_factory.mktemp("smollm2_bf16_work"), n_prompts=2)
    old = os.getcwd()
    os.chdir(root)
    try:
        main(
            [
                *BF16,
                "validate.max_new_tokens=8",
                "validate.temperature=null",
                "validate.concurrency=[1,2]",
                # the proof's two prompts in flight together: its counters still equal ours
                "validate.counting_concurrency=2",
            ]
        )
    finally:
        os.chdir(old)
    return root


def test_the_proof_stays_float32_and_every_speed_figure_comes_from_bf16_engines(bf16_run):
    root = bf16_run
    m = json.loads((root / "metrics/details/validate.json").read_text())
    v = m["vllm"]
    # the proof: float32 on the CPU, vLLM's counters equal ours (the stage enforces it)
    assert m["dtype"] == v["dtype"] == "float32"
    assert m["vllm"]["mean_acceptance_length"] == pytest.approx(
        m["ours"]["vllm_style_acceptance_length"]
    )
    assert v["num_drafts"] == m["ours"]["steps"] and m["vllm"]["lossless"] is True
    # ... with both prompts in flight (validate.counting_concurrency), per label still
    assert v["proof_concurrency"] == 2 and v["speed_prompts"] == 2
    assert m["sets"]["heldout"]["vllm"]["num_drafts"] == v["num_drafts"]
    # the speed: the target's precision, and why
    assert v["serving_dtype"] == "bfloat16"
    assert v["serving_dtype_why"] == "model.dtype=bfloat16 (set)"
    commands = v["commands"]
    assert list(commands) == [
        "with_draft",
        "without_draft",
        "serving_with_draft",
        "serving_without_draft",
    ]
    for name, dtype in zip(commands, ["float32"] * 2 + ["bfloat16"] * 2, strict=True):
        assert f"--dtype {dtype}" in commands[name]
    assert "--speculative-config" in commands["serving_with_draft"]
    assert "--speculative-config" not in commands["serving_without_draft"]
    # the engines vLLM started were in those precisions (its own config line)
    logs = root / "logs"
    for name, dtype in [("with_draft", "float32"), ("serving_with_draft", "bfloat16")]:
        assert f"dtype=torch.{dtype}" in (logs / f"vllm_validate_{name}.log").read_text()
    # the bf16 pair's own greedy stream: the draft used, its tokens what its tokens/s counts
    g = v["serving_greedy"]
    assert g["num_drafts"] > 0 and 0 <= g["lossless_prompts"] <= 2
    for run in ("with_draft", "without_draft"):
        assert v["wall_s"][run] > 0
    assert m["vllm"]["tokens_per_s_with_draft"] == pytest.approx(
        g["generated_tokens"] / v["wall_s"]["with_draft"]
    )
    assert m["vllm_speedup"] == pytest.approx(
        m["vllm"]["tokens_per_s_with_draft"] / m["vllm"]["tokens_per_s_without_draft"]
    )
    # every level from the bf16 pair: level 1 is its single stream, 2 its own pass
    levels = v["concurrency"]["levels"]
    assert [r["concurrency"] for r in levels] == [1, 2]
    assert levels[0]["tokens_per_s_with_draft"] == m["vllm"]["tokens_per_s_with_draft"]
    assert levels[1]["tokens_per_s_with_draft"] > 0
    report = (root / "data/validate/report.md").read_text()
    assert "the proof's in float32" in report and "the speed's in bfloat16" in report
    assert "temperature 0, in bfloat16" in report
