"""The GPU proof (scripts/gpu_proof.sh) and the wheels it travels with (scripts/gpu_wheels.py).

The GPU machine has no network, so a package the stages import that is neither
preinstalled there nor among the wheels is an ImportError that costs a lent machine's
minutes: the quick tests check the wheel list against every third-party import the stages
can reach (found by parsing, nothing imported), and the proof's CUDA assertions against the
records a GPU run writes (which a CPU machine cannot produce). The slow test runs the whole
proof with ``hardware=cpu``, the dry check.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from record_samples import (
    extract_record,
    gpu_reading,
    preflight_record,
    prepare_record,
    target_record,
    train_record,
    validate_record,
)
from stage_graph import STAGES, executed_modules

from eagle3_pipeline.core.config import load_config
from eagle3_pipeline.preflight.record import TorchView
from eagle3_pipeline.runtime.gpu import GpuMemory, GpuRelease, GpuSnapshot
from eagle3_pipeline.tools.graph import import_refs
from eagle3_pipeline.train.record import Launcher

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
PKG = "eagle3_pipeline"


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


wheels = _script("gpu_wheels")
proof = _script("gpu_proof")

# Third-party imports the stages can reach that the proof's path never runs, with the only
# modules allowed to import them: an import of one anywhere else fails the test below.
NOT_ON_PATH = {
    # the separate vLLM environment's worker, connector and plugin: validate.vllm=false and
    # extract.backend=hf start no vLLM
    "vllm": {f"{PKG}.serving.worker", f"{PKG}.serving.connector", f"{PKG}.compat.vllm_expand"},
    # a GGUF target (model.gguf): the proof builds the tiny target
    "gguf": {f"{PKG}.targets.gguf"},
}


def third_party_imports(module: str) -> set[str]:
    """Top-level names of the non-standard, non-package modules ``module`` imports, at
    any depth of its code (lazy imports are on the path as soon as their function runs)."""
    names = {ref.module.split(".")[0] for ref in import_refs(module)}
    return {n for n in names if n not in sys.stdlib_module_names and n not in (PKG, "__future__")}


def test_the_wheels_and_the_gpu_machine_cover_every_import_of_the_stages() -> None:
    covered = set(wheels.wheel_set("3.12")) | wheels.PREINSTALLED
    dists = md.packages_distributions()
    importers: dict[str, set[str]] = {}
    for stage in STAGES:
        for module in executed_modules(stage):
            for name in third_party_imports(module):
                importers.setdefault(name, set()).add(module)
    for name in proof.MODULES:  # what the proof imports before any stage runs
        if name != PKG:
            importers.setdefault(name, set()).add("scripts/gpu_proof.py")
    assert {"speculators", "hydra", "datasets", "dvclive", "torch"} <= set(importers)
    missing = []
    for name, where in sorted(importers.items()):
        if name in NOT_ON_PATH:
            stray = where - NOT_ON_PATH[name]
            assert not stray, f"{name} is imported by {sorted(stray)}, on the proof's path"
            continue
        owners = {wheels.canonical(d) for d in dists.get(name, [])}
        if not owners & covered:
            missing.append(f"{name} (distribution {sorted(owners) or '?'}, from {sorted(where)})")
    assert not missing, "add to scripts/gpu_wheels.py ROOTS: " + "; ".join(missing)


def test_the_wheel_set_is_each_package_once_at_this_environments_version() -> None:
    from packaging.requirements import Requirement

    wanted = wheels.wheel_set("3.12")
    assert {wheels.canonical(r) for r in wheels.ROOTS} <= set(wanted)
    assert not set(wanted) & wheels.PREINSTALLED
    env = wheels.marker_env("3.12")
    for name, version in wanted.items():
        assert md.version(name) == version, name
        for line in md.distribution(name).requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
                need = wheels.canonical(req.name)
                assert need in wanted or need in wheels.PREINSTALLED, f"{name} needs {need}"


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    cases = [
        ([str(SCRIPTS / "gpu_proof.py"), "validate.vllm=true"], "fixes validate.vllm"),
        ([str(SCRIPTS / "gpu_proof.py"), "hardware"], "key=value"),
        ([str(SCRIPTS / "gpu_proof.py"), "--workdir", str(tmp_path / "full")], "not an empty"),
        ([str(SCRIPTS / "gpu_wheels.py"), "--python-version", "3"], "give X.Y"),
    ]
    for argv, words in cases:
        proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], proc.stderr


# --------------------------------------------------------------------------- CUDA records

SNAP = GpuSnapshot(mode="cuda", gpus=[GpuMemory(0, "GPU-0", 1, [])])


def _gpu_run(cfg: Any) -> dict[str, Any]:
    """What an H200 run of the proof writes, record by record (the stages' own types)."""
    return {
        "preflight": preflight_record(
            mode="cuda",
            hardware="h200_x1",
            driver_version="580.159.04",
            cuda_driver_version="13.0",
            no_driver=None,
            gpu_count_visible=1,
            gpus=[gpu_reading()],
            torch=TorchView(version="2.11.0", cuda="13.0", device_count=1),
            packages={"torch": "2.11.0", "speculators": "0.9.0"},
            snapshot=SNAP,
        ),
        "target": target_record(
            built=True,
            name=cfg.model.name,
            parameters=2_073_088,
            reload_logits_identical=True,
            perplexity_ratio_vs_unigram=0.15,
        ),
        "prepare": prepare_record(rows=4, regenerate=True, backend="hf"),
        "extract": extract_record(
            samples=4,
            samples_written=4,
            device="cuda",
            model_dtype="bfloat16",
            peak_gpu_memory_bytes=2**30,
        ),
        "train": train_record(
            device="cuda",
            dtype="bfloat16",
            launcher=Launcher(
                command="torchrun --nproc_per_node=1 -m eagle3_pipeline.train.worker",
                nproc=1,
                nodes=1,
                process_group=4242,
                survivors=0,
            ),
            gpu=GpuRelease(
                mode="cuda",
                after_workers_exit=SNAP,
                compared_with_preflight=True,
                clean=True,
                problems=[],
            ),
            gpu_released=True,
        ),
        "validate": validate_record(
            device="cuda",
            dtype="bfloat16",
            ours=dataclasses.replace(validate_record().ours, prompts=6),
            acceptance_length=2.5,
            lossless=False,
        ),
    }


def _write_run(cfg: Any, records: dict[str, Any]) -> None:
    for stage, record in records.items():
        record.write(Path(cfg.paths.details) / f"{stage}.json")
    for path, text in {
        Path(cfg.paths.target) / "target.json": "{}",
        Path(cfg.paths.heldout) / "prompts.jsonl": "{}\n" * 8,
        Path(cfg.paths.validate) / "report.md": "# report\n",
        Path(cfg.paths.live) / "train" / "metrics.json": json.dumps({"tokens_per_s": 1.0}),
        Path(cfg.paths.live) / "validate" / "metrics.json": json.dumps({"acceptance_length": 2}),
        **{Path(cfg.paths.hidden_states) / f"hs_{i}.safetensors": "" for i in range(4)},
    }.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def gpu_ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(proof.overrides_for(["hardware=h200_x1"], "cuda"), conf_dir=REPO / "conf")
    return proof.Context(cfg, proof.expected(cfg))


def test_an_h200_runs_records_pass_every_cuda_assertion(gpu_ctx: Any) -> None:
    e = gpu_ctx.expected
    bf16 = "bfloat16"
    assert (e.device, e.model_dtype, e.train_dtype, e.validate_dtype) == ("cuda", bf16, bf16, bf16)
    _write_run(gpu_ctx.cfg, _gpu_run(gpu_ctx.cfg))
    facts = {stage: proof.CHECKS[stage](gpu_ctx) for stage in STAGES}
    assert "NVIDIA H200" in facts["preflight"][0]
    assert facts["train"][-1].startswith("GPU memory released")


@pytest.mark.parametrize(
    "stage, change, words",
    [
        ("preflight", {"no_driver": "no NVIDIA driver", "driver_version": None}, "NVML could"),
        ("preflight", {"gpus": [gpu_reading(name="NVIDIA H100")]}, "expected 'H200'"),
        ("extract", {"device": "cpu"}, "device 'cpu', expected 'cuda'"),
        ("extract", {"model_dtype": "float32"}, "model dtype 'float32'"),
        ("extract", {"peak_gpu_memory_bytes": None}, "nothing ran on the GPU"),
        ("train", {"dtype": "float32"}, "dtype 'float32', expected 'bfloat16'"),
        ("train", {"launcher": None}, "no torchrun launch"),
        (
            "train",
            {
                "gpu_released": False,
                "gpu": GpuRelease(
                    mode="cuda",
                    after_workers_exit=SNAP,
                    compared_with_preflight=True,
                    clean=False,
                    problems=["GPU 0: 900 MiB in use, 1 MiB at preflight"],
                ),
            },
            "GPU memory not released: ['GPU 0: 900 MiB",
        ),
        ("validate", {"device": "cpu"}, "device 'cpu', expected 'cuda'"),
        ("validate", {"acceptance_length": 1.0}, "accepted none"),
    ],
)
def test_a_cuda_fact_that_does_not_hold_is_named(
    gpu_ctx: Any, stage: str, change: dict[str, Any], words: str
) -> None:
    records = _gpu_run(gpu_ctx.cfg)
    for key, value in change.items():
        setattr(records[stage], key, value)
    _write_run(gpu_ctx.cfg, records)
    with pytest.raises(proof.ProofFailure) as failed:
        proof.CHECKS[stage](gpu_ctx)
    assert words in str(failed.value)


# --------------------------------------------------------------------------- the dry check


@pytest.mark.slow
def test_the_proof_passes_on_cpu_end_to_end(tmp_path: Path) -> None:
    """``hardware=cpu``: the same stages and assertions, their CPU equivalents for the
    CUDA ones (about 2 minutes on 2 cores)."""
    work = tmp_path / "work"
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(
        # a smaller target and draft than the proof's own on a GPU: the same stages and
        # checks, in about half the time on 2 cores
        [
            str(SCRIPTS / "gpu_proof.sh"),
            "hardware=cpu",
            "target.train_steps=100",
            "train.samples=60",
            "train.epochs=4",
            "--workdir",
            str(work),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for stage in STAGES:
        assert f"== {stage}: ok in" in proc.stdout
    assert "NVML: no GPU" in proc.stdout and "no GPU reading" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("gpu_proof: OK: 6 stages on cpu")
    record = json.loads((work / "metrics/details/extract.json").read_text())
    assert (record["device"], record["model_dtype"]) == ("cpu", "float32")
