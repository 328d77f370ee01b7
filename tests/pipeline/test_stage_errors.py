"""Bad input reaches the user as one line naming the key, with a non-zero exit: from a
stage entrypoint and from ``dvc exp run -S`` (whose Hydra composition DVC runs itself)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from workdirs import repo_copy

ROOT = Path(__file__).resolve().parents[2]


def test_a_missing_model_path_is_one_line_naming_it(tmp_path: Path, monkeypatch, capsys) -> None:
    """``model.path=/nonexistent`` is a config error of the target, not a failed disk
    estimate, and no ``preflight.strict=false`` can make it pass."""
    from eagle3_pipeline.stages.preflight import main

    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["model.tiny=null", "model.path=/nonexistent/kimi", "validate.vllm=false"])
    assert exc.value.code == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert err == ["error: preflight: model.path=/nonexistent/kimi: directory does not exist"]
    assert not (tmp_path / "data/preflight/target_fingerprint.json").exists()


def test_a_missing_data_file_is_one_line_naming_it(tmp_path: Path, monkeypatch, capsys) -> None:
    from eagle3_pipeline.stages.preflight import main

    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "data.source=file",
                f"data.path={missing}",
                "preflight.strict=false",
                "validate.vllm=false",
            ]
        )
    assert exc.value.code == 1  # strict=false does not wave a config error through
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert err == [
        f"error: preflight: data.path={missing}: no such file; point data.path at "
        "a JSONL or JSON file of conversations (or use data.source=builtin)"
    ]


@pytest.fixture(scope="module")
def committed_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return repo_copy(tmp_path_factory.mktemp("exp_repo"), commit=True)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "train.epocs=2",
            "ERROR: params: Could not override 'train.epocs'; Key 'epocs' not in "
            "'TrainConfig' (did you mean train.epochs?)",
        ),
        (
            "train.epochs=abc",
            "ERROR: params: Error merging override train.epochs=abc; Value 'abc' "
            "of type 'str' could not be converted to Integer",
        ),
        (
            "train.parallel=fdsp",
            "ERROR: params: Error merging override train.parallel=fdsp; "
            "Invalid value 'fdsp', expected one of [auto, ddp, fsdp]",
        ),
        # the schema's ranges and cross-key rules, checked on what DVC composed
        ("validate.k=0", "ERROR: params: validate.k=0 must be >= 1 (or null)"),
        (
            "validate.k_sweep=[1,9]",
            "ERROR: params: validate.k_sweep=[1, 9]: [9] outside 1..3 "
            "(train.speculative_tokens: the draft is trained for that many "
            "steps)",
        ),
    ],
)
@pytest.mark.integration
def test_a_bad_override_under_dvc_exp_run_is_one_line(
    committed_copy: Path, override: str, expected: str
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dvc", "exp", "run", "--dry", "-S", override],
        cwd=committed_copy,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DVC_NO_ANALYTICS": "1"},
    )
    assert proc.returncode != 0
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert lines == [expected], lines
