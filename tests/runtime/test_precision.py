"""The precision a run computes in where no key names one: preflight's choice from the
target and the CPU (each CPU stated as the platform reports it, never read from the
machine running the test), the file the later stages read, and how each stage resolves."""

from __future__ import annotations

from pathlib import Path

import pytest
from cpus import EPYC, EPYC_ZEN4, XEON_AMX

from eagle3_pipeline.core.errors import StageError
from eagle3_pipeline.runtime.cpu import CpuReading
from eagle3_pipeline.runtime.precision import (
    Precision,
    chosen,
    default_precision,
    model_precision,
    read_precision,
    rule_precision,
    write_precision,
)


@pytest.mark.parametrize(
    ("device", "tiny", "cpu", "dtype"),
    [
        ("cpu", False, XEON_AMX, "bfloat16"),  # AMX: native bf16
        ("cpu", False, EPYC_ZEN4, "bfloat16"),  # AVX512-BF16 without AMX: native too
        ("cpu", False, EPYC, "float32"),  # AVX2 only: bf16 would be emulated
        ("cpu", False, None, "float32"),  # not read: never assume bf16
        ("cpu", True, XEON_AMX, "float32"),  # the tiny target: float32 on every CPU
        ("cpu", True, EPYC, "float32"),
        ("cuda", False, None, "bfloat16"),  # a real target on GPUs
        ("cuda", True, None, "float32"),
    ],
)
def test_the_rule(device: str, tiny: bool, cpu: CpuReading | None, dtype: str) -> None:
    assert default_precision(device, tiny, cpu).dtype == dtype


def test_the_tiny_target_gets_the_same_choice_on_every_cpu() -> None:
    """The file's content names the choice, not the CPU: the default run's stages do not
    rerun when the same repository moves to a CPU of another kind."""
    choices = {default_precision("cpu", True, c) for c in (XEON_AMX, EPYC_ZEN4, EPYC, None)}
    assert len(choices) == 1
    # two CPUs with native bf16 of different kinds give one file too
    assert default_precision("cpu", False, XEON_AMX) == default_precision("cpu", False, EPYC_ZEN4)


def test_a_key_wins_over_the_rule_and_says_so(tmp_path: Path) -> None:
    rule = Precision("bfloat16", "a real target on a CPU that computes bf16 natively")
    assert chosen("train.dtype", None, rule) is rule
    assert chosen("train.dtype", "float32", rule) == Precision(
        "float32", "train.dtype=float32 (set)"
    )
    # model.dtype set: preflight's file is not even read
    absent = tmp_path / "absent.json"
    assert model_precision("float32", "cpu", False, absent).why == "model.dtype=float32 (set)"


def test_the_file_round_trips_and_a_damaged_one_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "precision.json"
    p = Precision("bfloat16", "a real target on a CPU that computes bf16 natively")
    write_precision(path, p)
    assert read_precision(path) == p == model_precision(None, "cpu", False, path)
    assert rule_precision("cpu", True, path) == p  # the file decides, not the arguments
    path.write_text('{"dtype": "bfloat16"}')
    with pytest.raises(StageError, match=r"precision.json: unreadable \(KeyError.*rerun preflight"):
        read_precision(path)


def test_without_preflight_s_file_the_rule_is_applied_here_and_says_so(tmp_path: Path) -> None:
    """A stage run by hand, outside DVC (which runs none whose dependency is missing):
    the same rule preflight applies, on this machine, named as chosen here."""
    absent = tmp_path / "precision.json"
    assert read_precision(absent) is None
    tiny = rule_precision("cpu", True, absent)  # the tiny target: float32 on any CPU
    assert tiny.dtype == "float32" and tiny.why.endswith("(chosen here: no precision.json)")
    gpu = model_precision(None, "cuda", False, absent)  # no CPU is read for a GPU profile
    assert gpu.dtype == "bfloat16" and gpu.why.startswith("a real target on GPUs")
