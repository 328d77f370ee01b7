"""eagle3-compare against real `dvc exp run` experiments of a small DVC project (a stage
that writes validate/train summaries the way the pipeline's stages lay them out), and
against the pipeline's own experiments in tests/pipeline/test_pipeline_dvc.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from commands import run_ok

from eagle3_pipeline.tools.experiments.compare import (
    Experiment,
    changed_params,
    experiments_from_json,
    main,
)
from eagle3_pipeline.tools.experiments.render import LABEL_CHARS, curve_label, series

STAGE = """\
import json, os, yaml
p = yaml.safe_load(open("params.yaml"))
s, lr = p["train"]["samples"], p["train"]["lr"]
os.makedirs("dvclive/validate", exist_ok=True)
os.makedirs("dvclive/train", exist_ok=True)
json.dump({"acceptance_length": 1 + s / 1000, "vllm_speedup": 1 + s / 2000, "k": 3},
          open("dvclive/validate/metrics.json", "w"))
json.dump({"step": 10, "val": {"loss": 5 - s / 1000 + lr}}, open("dvclive/train/metrics.json", "w"))
# the stages' details as the pipeline writes them: wall times, and the cores preflight read
os.makedirs("metrics/details", exist_ok=True)
for stage, wall in (("prepare", 3.6 * s), ("extract", 360.0), ("train", 1800.0)):
    json.dump({"wall_s": wall}, open(f"metrics/details/{stage}.json", "w"))
json.dump({"cpu": {"cores": 2}}, open("metrics/details/preflight.json", "w"))
"""
DVC_YAML = """\
stages:
  fake:
    cmd: python fake.py
    deps: [fake.py]
    params: [train]
    outs:
      - metrics/details: {cache: false}
    metrics:
      - dvclive/validate/metrics.json: {cache: false}
      - dvclive/train/metrics.json: {cache: false}
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("proj")
    (root / "fake.py").write_text(STAGE)
    (root / "dvc.yaml").write_text(DVC_YAML)
    (root / "params.yaml").write_text(
        "train:\n  samples: 24\n  lr: 0.001\npaths:\n  live: dvclive\n"
    )
    dvc = (sys.executable, "-m", "dvc")
    run_ok(root, "git", "init", "-q")
    run_ok(root, *dvc, "init", "-q")
    run_ok(root, *dvc, "repro", "-q")
    run_ok(root, "git", "add", "-A")
    run_ok(root, "git", "commit", "-qm", "baseline")
    run_ok(root, *dvc, "exp", "run", "-q", "-S", "train.samples=1000", "--name", "more-samples")
    run_ok(
        root,
        *dvc,
        "exp",
        "run",
        "-q",
        "-S",
        "train.samples=24",
        "-S",
        "train.lr=0.01",
        "--name",
        "higher-lr",
    )
    return root


@pytest.mark.integration  # real `dvc exp run` experiments
def test_every_experiment_with_the_params_that_differ(project: Path, capsys, tmp_path):
    out = tmp_path / "compare.png"
    assert main(["--repo", str(project), "--out", str(out)]) == 0
    text = capsys.readouterr().out.splitlines()
    header = text[0].split()
    assert header[:3] == ["experiment", "train.samples", "train.lr"]
    rows = {line.split()[0]: line.split() for line in text[2:-1]}
    # the baseline commit, and both experiments; values straight from their metrics files
    assert set(rows) == {"master", "more-samples", "higher-lr"} or set(rows) == {
        "main",
        "more-samples",
        "higher-lr",
    }
    assert rows["more-samples"][1:] == ["1000", "0.001", "2", "1.5", "4.001"]
    assert rows["higher-lr"][1:] == ["24", "0.01", "1.024", "1.012", "4.986"]
    assert out.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.integration  # real `dvc exp run` experiments
def test_the_figures_are_dvcs_own(project: Path):
    shown = json.loads(run_ok(project, sys.executable, "-m", "dvc", "exp", "show", "--json").stdout)
    rows = experiments_from_json(shown)
    assert changed_params(rows) == ["train.samples", "train.lr"]
    by_name = {r.name: r for r in rows}
    assert by_name["more-samples"].figures == {
        "acceptance length": 2.0,
        "vLLM speedup": 1.5,
        "MT-Bench": None,  # run without validate.prompt_sets' benchmarks
        "HumanEval": None,
        "MT-Bench T>0": None,
        "break-even C": None,
        "val loss": pytest.approx(4.001),
        "best K": None,
        "best-K speedup": None,
    }  # run without validate.k_sweep


def test_nothing_validated_is_one_line(tmp_path, capsys):
    empty = tmp_path / "shown.json"
    empty.write_text("[]")
    assert main(["--json", str(empty), "--out", str(tmp_path / "x.png")]) == 1
    assert capsys.readouterr().err.startswith("error: compare: no experiment has validated")


@pytest.mark.integration  # a real DVC experiment queue over train.samples
def test_a_queued_sweep_draws_acceptance_against_samples_and_cpu_hours(
    project: Path, capsys, tmp_path
):
    dvc = (sys.executable, "-m", "dvc")
    run_ok(project, *dvc, "exp", "run", "--queue", "-S", "train.samples=100,400")
    run_ok(project, *dvc, "exp", "run", "--run-all")
    out = tmp_path / "scaling.png"
    assert main(["--repo", str(project), "--out", str(out), "--x", "train.samples"]) == 0
    text = capsys.readouterr().out.splitlines()
    header = text[0].split()
    assert header[:2] == ["experiment", "train.samples"]
    assert header[-2:] == ["hours", "CPU-hours"]
    samples = [line.split()[1] for line in text[2:-1]]
    # every experiment along train.samples, in its order: the baseline, both queued, the rest
    assert samples == sorted(samples, key=int)
    assert {"24", "100", "400", "1000"} <= set(samples)
    by_samples = {line.split()[1]: line.split() for line in text[2:-1]}
    # prepare 3.6 s a sample + extract 360 s + train 1800 s, read from each one's own commit
    hours = (3.6 * 400 + 360 + 1800) / 3600
    assert float(by_samples["400"][-2]) == pytest.approx(hours, rel=1e-3)
    assert float(by_samples["400"][-1]) == pytest.approx(2 * hours, rel=1e-3)
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_a_sweep_along_a_param_no_experiment_has_is_one_line(tmp_path, capsys):
    shown = tmp_path / "shown.json"
    validated = {
        "params": {"params.yaml": {"data": {"train": {"samples": 24}}}},
        "metrics": {"dvclive/validate/metrics.json": {"data": {"acceptance_length": 2.0}}},
    }
    shown.write_text(json.dumps([{"rev": "workspace", "data": validated}]))
    args = ["--json", str(shown), "--repo", str(tmp_path), "--x", "train.nothing"]
    assert main([*args, "--out", str(tmp_path / "x.png")]) == 1
    assert "no validated experiment has a numeric train.nothing" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_a_sweep_is_one_curve_per_combination_of_the_other_params():
    def row(name: str, samples: int, lr: float) -> Experiment:
        return Experiment(name, name, {"train.samples": samples, "train.lr": lr})

    rows = [row("a", 64, 0.001), row("b", 250, 0.001), row("c", 250, 0.01), row("d", 1000, 0.001)]
    curves = series(rows, "train.samples", changed_params(rows))
    assert {k: [r.name for r in v] for k, v in curves.items()} == {
        "train.lr=0.001": ["a", "b", "d"],
        "train.lr=0.01": ["c"],
    }
    assert list(series(rows[:2], "train.samples", changed_params(rows[:2]))) == [""]


def test_only_keeps_the_named_experiments_and_names_the_others_when_none_match(tmp_path, capsys):
    def state(samples: int, accept: float) -> dict:
        return {
            "params": {"params.yaml": {"data": {"train": {"samples": samples}}}},
            "metrics": {"dvclive/validate/metrics.json": {"data": {"acceptance_length": accept}}},
        }

    shown = tmp_path / "shown.json"
    sweep = [
        {"name": f"sweep-{n}", "revs": [{"rev": f"{n:040d}", "data": state(n, 1 + n / 1e3)}]}
        for n in (64, 250)
    ]
    default = {"rev": "workspace", "data": state(240, 3.6)}
    shown.write_text(json.dumps([default, {"rev": "a" * 40, "experiments": sweep}]))
    args = ["--json", str(shown), "--out", str(tmp_path / "x.png")]
    assert main([*args, "--only", "sweep-*"]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[2:-1]]
    assert rows == ["sweep-64", "sweep-250"]  # the workspace's default run left out
    assert main([*args, "--only", "nothing-*"]) == 1
    err = capsys.readouterr().err
    assert "no validated experiment matches --only nothing-*" in err
    assert "workspace, sweep-64, sweep-250" in err


def test_a_curve_with_a_long_difference_is_named_by_its_experiments():
    short = "train.lr=0.01"
    assert curve_label(short, []) == short
    members = [Experiment("workspace", "workspace"), Experiment("tiny", "tiny")]
    long = ", ".join(f"model.tiny.p{i}=1" for i in range(10))
    assert curve_label(long, members) == "workspace, tiny"
    many = [Experiment(f"experiment-{i}", str(i)) for i in range(10)]
    assert len(curve_label(long, many)) == LABEL_CHARS
    assert curve_label(long, many).endswith("...")


def test_the_cost_counts_the_stages_that_make_the_draft_and_no_partial_sum(tmp_path):
    """A GGUF target's conversion counts as its build; preflight and validate do not
    count; a missing stage figure gives no hours rather than a cheaper-looking sum."""
    from eagle3_pipeline.tools.experiments.cost import read_cost

    details = tmp_path / "metrics/details"
    details.mkdir(parents=True)
    figures = {
        "target": {"gguf": {"convert_s": 90.0}},
        "prepare": {"wall_s": 1800.0},
        "extract": {"wall_s": 900.0},
        "train": {"wall_s": 3600.0},
        "validate": {"wall_s": 99999.0},
        "preflight": {"cpu": {"cores": 2}},
    }
    for stage, data in figures.items():
        (details / f"{stage}.json").write_text(json.dumps(data))
    cost = read_cost(tmp_path, "workspace", None)
    assert cost.hours == pytest.approx((90 + 1800 + 900 + 3600) / 3600)
    assert cost.cpu_hours == pytest.approx(2 * cost.hours)
    (details / "extract.json").unlink()
    assert read_cost(tmp_path, "workspace", "metrics/details").hours is None
