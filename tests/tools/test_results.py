"""``eagle3-results``: the results page is generated from kept runs' own records, names the
commit and machine of each, and its check fails when page and records disagree."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from record_samples import (
    gpu_reading,
    preflight_record,
    target_record,
    train_record,
    validate_record,
    validate_record_in_vllm,
)

from eagle3_pipeline.tools import results
from eagle3_pipeline.tools.results import ResultsError, Run, add, render

ROOT = Path(__file__).resolve().parents[2]


def _workdir(tmp_path: Path, vllm: bool = True, **preflight: object) -> Path:
    """A git work tree holding a whole run's details records."""
    work = tmp_path / "work"
    details = work / "metrics" / "details"
    details.mkdir(parents=True)
    preflight_record(**preflight).write(details / "preflight.json")
    target_record().write(details / "target.json")
    train_record().write(details / "train.json")
    (validate_record_in_vllm() if vllm else validate_record()).write(details / "validate.json")
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "run"], check=True)
    return work


def test_a_kept_run_renders_with_its_commit_machine_and_conditions(tmp_path: Path) -> None:
    work = _workdir(tmp_path)
    kept = add("tiny", work, "the default graph", "dvc repro", root=tmp_path / "results")
    meta = yaml.safe_load((kept / "run.yaml").read_text())
    assert meta["command"] == "dvc repro" and len(meta["commit"]) >= 7
    run = Run.read(kept)
    page = render(tmp_path / "results")
    v = run.validate
    assert f"commit `{meta['commit']}`" in page
    assert run.preflight.cpu.model and run.preflight.cpu.model in page
    assert f"native bf16: {run.preflight.cpu.bf16}" in page
    assert f"K={v.k}, T=0" in page and "concurrency" in page
    assert f"{v.acceptance_length:.3f}" in page  # from the record, not typed in
    assert v.vllm is not None and v.vllm.speedup is not None
    assert f"{v.vllm.speedup:.2f}x" in page
    assert v.vllm.sampled is not None and f"T={v.vllm.sampled.temperature}" in page


def test_a_gpu_run_names_its_gpus(tmp_path: Path) -> None:
    work = _workdir(tmp_path, mode="cuda", gpus=[gpu_reading(), gpu_reading(index=1)])
    kept = add("gpu", work, "a GPU run", "dvc repro", root=tmp_path / "results")
    assert "2 x NVIDIA" in Run.read(kept).machine()


def test_a_run_without_vllm_renders_only_our_figures(tmp_path: Path) -> None:
    kept = add("ours", _workdir(tmp_path, vllm=False), "no vLLM", "x", root=tmp_path / "r")
    page = render(tmp_path / "r")
    assert kept.is_dir() and "vLLM's counters" not in page and "our evaluator" in page


def test_an_incomplete_run_is_refused_and_keeps_nothing(tmp_path: Path) -> None:
    work = _workdir(tmp_path)
    (work / "metrics" / "details" / "train.json").unlink()
    with pytest.raises(ResultsError, match=r"details: no train\.json"):
        add("tiny", work, "w", "c", root=tmp_path / "results")
    assert not (tmp_path / "results" / "tiny").exists()


def test_the_check_fails_when_page_and_records_disagree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    add("tiny", _workdir(tmp_path), "w", "c")
    with pytest.raises(SystemExit) as err:
        results.main(["--check"])
    assert err.value.code == 1  # never written
    results.main([])
    results.main(["--check"])  # in sync
    page = Path("docs/results.md")
    page.write_text(page.read_text().replace("acceptance length", "acceptance", 1))
    with pytest.raises(SystemExit):
        results.main(["--check"])


def test_the_repository_page_matches_its_kept_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    results.main(["--check"])
