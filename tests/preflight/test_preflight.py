"""Preflight checks against hardware profiles, on in-memory machines and on this CPU box."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest
from cpus import EPYC, XEON_AMX
from machines import BLACKWELL, cfg_for, rtx

from eagle3_pipeline.core.config import Config
from eagle3_pipeline.preflight.hardware import TorchView
from eagle3_pipeline.preflight.record import DiskReading
from eagle3_pipeline.preflight.result import render_preflight
from eagle3_pipeline.preflight.run import run_preflight
from eagle3_pipeline.preflight.view import PreflightInputs
from eagle3_pipeline.runtime.cpu import CpuReading
from eagle3_pipeline.runtime.gpu import (
    GpuInfo,
    GpuProcess,
    MemoryReader,
    NoGpuDriver,
    open_reader,
    select_visible,
)
from eagle3_pipeline.runtime.precision import default_precision

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
VERSIONS = {"torch": "2.14.1", "transformers": "5.19.0", "speculators": "0.9.0", "vllm": None}
PLENTY = 10**15  # bytes of free disk


def h200(i: int) -> GpuInfo:
    return GpuInfo(i, "NVIDIA H200", f"GPU-h200{i:04d}", 143771, 0, (9, 0))


def vllm_build(cpu: bool):
    """An in-memory reading of the vLLM environment (the real one is probed in the CPU tests)."""
    from eagle3_pipeline.serving.env import VllmProbe

    version = "0.32.0+cpu" if cpu else "0.33.0"
    return lambda cfg: VllmProbe(
        python="/venv/bin/python", version=version, cpu_build=cpu, cli_version=version
    )


def run(cfg: Config, gpus: list[GpuInfo], env: dict[str, str] | None = None, **kw):
    """Preflight on an in-memory machine; torch sees what CUDA_VISIBLE_DEVICES lets it."""
    env = env or {}

    def torch_sees() -> TorchView:
        n = len(select_visible(gpus, env.get("CUDA_VISIBLE_DEVICES")))
        return TorchView("2.14.1+cu128", "12.8", n)

    kw.setdefault("torch_probe", torch_sees)
    kw.setdefault("free_fn", lambda p: PLENTY)
    kw.setdefault("versions", dict(VERSIONS))
    kw.setdefault("vllm_probe", vllm_build(cfg.hardware.device == "cpu"))
    kw.setdefault("cpu_probe", lambda: EPYC)
    return run_preflight(PreflightInputs.from_config(cfg), reader=MemoryReader(gpus), env=env, **kw)


def failed(result) -> dict[str, list[str]]:
    return {c.name: c.problems for c in result.checks if not c.passed}


# --------------------------------------------------------------------------- the cases


def test_eight_idle_blackwells_pass(tmp_path):
    cfg = cfg_for(tmp_path, "hardware=rtx_pro_6000_x8")
    res = run(cfg, [rtx(i) for i in range(8)])
    assert failed(res) == {} and res.passed and res.mode == "cuda"
    assert res.inventory == {
        "mode": "cuda",
        "gpu_count": 8,
        "gpus": [
            {"name": BLACKWELL, "memory_total_mib": 97887, "compute_capability": "12.0", "count": 8}
        ],
    }
    m = res.metrics
    assert m.passed is True and m.gpu_count_visible == 8
    assert m.gpus[3].uuid.startswith("GPU-03") and m.snapshot.mode == "cuda"
    table = render_preflight(res)
    assert "preflight passed" in table and "97,887 MiB" in table


def test_inventory_is_stable_across_readings(tmp_path):
    """No UUIDs, driver versions or memory in use: a rerun on a busier identical node
    writes the same inventory, so downstream stages stay cached."""
    cfg = cfg_for(tmp_path, "hardware=rtx_pro_6000_x8")
    cfg.hardware.idle_memory_mib = 10**6
    a = run(cfg, [rtx(i) for i in range(8)]).inventory
    other = [dataclasses.replace(rtx(i, used=500 + i), uuid=f"GPU-other{i}") for i in range(8)]
    assert run(cfg, other).inventory == a
    text = json.dumps(a)
    assert "GPU-" not in text and "used" not in text


def test_busy_gpu_with_a_foreign_process_fails_with_an_actionable_line(tmp_path):
    cfg = cfg_for(tmp_path, "hardware=rtx_pro_6000_x8")
    gpus = [rtx(i) for i in range(8)]
    gpus[3] = rtx(3, used=41_210, procs=(GpuProcess(8812, "python", 41_210),))
    res = run(cfg, gpus)
    assert failed(res) == {
        "gpu_idle": [
            "GPU 3: 41,210 MiB used by pid 8812 (python): stop it or set CUDA_VISIBLE_DEVICES"
        ]
    }
    assert res.metrics.passed is False and res.metrics.failures == 1
    assert "FAIL: GPU 3: 41,210 MiB used by pid 8812 (python)" in render_preflight(res)


def test_memory_held_by_processes_not_visible_here(tmp_path):
    cfg = cfg_for(tmp_path, "hardware=rtx_pro_6000_x8")
    gpus = [rtx(i) for i in range(8)]
    gpus[5] = rtx(5, used=20_000)
    (line,) = failed(run(cfg, gpus))["gpu_idle"]
    assert line.startswith("GPU 5: 20,000 MiB used by processes not visible here")


def test_expected_process_is_allowed(tmp_path):
    cfg = cfg_for(tmp_path, "hardware=rtx_pro_6000_x8", "hardware.expected_processes=[vllm]")
    serve = GpuProcess(7001, "vllm", 80_000)
    gpus = [rtx(i, used=80_300, procs=(serve,)) for i in range(8)]
    res = run(cfg, gpus)
    assert failed(res) == {}
    # ... but a second, undeclared process on one of them still fails
    gpus[2] = rtx(2, used=90_000, procs=(serve, GpuProcess(9, "python", 9_700)))
    assert failed(run(cfg, gpus))["gpu_idle"] == [
        "GPU 2: 9,700 MiB used by pid 9 (python): stop it or set CUDA_VISIBLE_DEVICES"
    ]


def test_seven_of_eight_visible(tmp_path):
    cfg = cfg_for(tmp_path, "hardware=rtx_pro_6000_x8")
    res = run(cfg, [rtx(i) for i in range(8)], env={"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6"})
    assert failed(res) == {
        "gpu_count": [
            "7 GPU(s) visible (CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6), hardware=rtx_pro_6000_x8 "
            "expects 8: check CUDA_VISIBLE_DEVICES and nvidia-smi"
        ]
    }


def test_torch_and_nvml_disagree(tmp_path):
    cfg = cfg_for(tmp_path, "hardware=rtx_pro_6000_x8")
    res = run(cfg, [rtx(i) for i in range(8)], torch_probe=lambda: TorchView("2.14.1", "12.8", 7))
    assert failed(res) == {
        "torch_devices": [
            "torch sees 7 CUDA device(s), NVML sees 8: check the driver / CUDA runtime "
            "compatibility and CUDA_VISIBLE_DEVICES"
        ]
    }


def test_h200_where_blackwell_expected(tmp_path):
    cfg = cfg_for(tmp_path, "hardware=rtx_pro_6000_x8")
    res = run(cfg, [h200(i) for i in range(8)])
    f = failed(res)
    assert set(f) == {"gpu_model", "gpu_memory", "compute_capability"}
    assert f["gpu_model"][0] == (
        "GPU 0: NVIDIA H200 is not a 'RTX PRO 6000 Blackwell' (hardware=rtx_pro_6000_x8): pick "
        "the hardware profile of this machine or exclude it with CUDA_VISIBLE_DEVICES"
    )
    assert f["compute_capability"][0] == (
        "GPU 0: compute capability 9.0 < 12.0 required by hardware=rtx_pro_6000_x8"
    )
    assert f["gpu_memory"][0].startswith("GPU 0: 143,771 MiB total, hardware=rtx_pro_6000_x8")
    assert all(len(v) == 8 for v in f.values())
    # and the H200 profile accepts one of them
    res = run(cfg_for(tmp_path, "hardware=h200_x1"), [h200(0)])
    assert failed(res) == {}


def test_mig_enabled_fails(tmp_path):
    cfg = cfg_for(tmp_path, "hardware=rtx_pro_6000_x8")
    gpus = [rtx(i) for i in range(8)]
    gpus[1] = rtx(1, mig_enabled=True, mig_uuids=("MIG-aaaa",))
    assert failed(run(cfg, gpus)) == {
        "mig": [
            "GPU 1: MIG mode is enabled, the run needs whole GPUs: disable it "
            "(sudo nvidia-smi -i 1 -mig 0) or exclude it with CUDA_VISIBLE_DEVICES"
        ]
    }


def test_prohibited_compute_mode_fails(tmp_path):
    cfg = cfg_for(tmp_path, "hardware=h200_x1")
    gpu = dataclasses.replace(h200(0), compute_mode="prohibited")
    assert "nvidia-smi -i 0 -c DEFAULT" in failed(run(cfg, [gpu]))["compute_mode"][0]


def test_visible_subset_by_index_avoids_a_busy_gpu(tmp_path):
    cfg = cfg_for(tmp_path, "hardware=rtx_pro_6000_x8", "hardware.gpu_count=2")
    cfg.hardware.serving.tensor_parallel_size = 2
    gpus = [rtx(i) for i in range(8)]
    gpus[0] = rtx(0, used=41_210, procs=(GpuProcess(8812, "python", 41_210),))
    assert "gpu_idle" in failed(run(cfg, gpus, env={"CUDA_VISIBLE_DEVICES": "0,1"}))
    res = run(cfg, gpus, env={"CUDA_VISIBLE_DEVICES": "6,7"})
    assert failed(res) == {}
    assert [g.index for g in res.metrics.gpus] == [6, 7]
    assert res.metrics.cuda_visible_devices == "6,7"


def test_visible_subset_by_uuid_names_the_cuda_ordinal(tmp_path):
    cfg = cfg_for(tmp_path, "hardware=rtx_pro_6000_x8", "hardware.gpu_count=1")
    gpus = [rtx(i) for i in range(8)]
    gpus[5] = rtx(5, used=3_000, procs=(GpuProcess(77, "python3", 2_900),))
    res = run(cfg, gpus, env={"CUDA_VISIBLE_DEVICES": gpus[5].uuid[:12]})
    assert failed(res)["gpu_idle"] == [
        "GPU 0 (NVML index 5): 2,900 MiB used by pid 77 (python3): stop it or set "
        "CUDA_VISIBLE_DEVICES"
    ]
    res = run(cfg, gpus, env={"CUDA_VISIBLE_DEVICES": gpus[4].uuid})
    assert failed(res) == {} and res.metrics.gpus[0].index == 4


def test_bad_cuda_visible_devices_is_a_failed_check(tmp_path):
    cfg = cfg_for(tmp_path, "hardware=rtx_pro_6000_x8")
    res = run(
        cfg,
        [rtx(i) for i in range(8)],
        env={"CUDA_VISIBLE_DEVICES": "GPU-nope"},
        torch_probe=lambda: TorchView("2.14.1", "12.8", 0),
    )
    assert failed(res)["visible_devices"] == [
        "CUDA_VISIBLE_DEVICES entry 'GPU-nope' matches no GPU UUID"
    ]
    assert not res.passed


def test_torch_cpu_build_cannot_reach_the_gpus(tmp_path):
    cfg = cfg_for(tmp_path, "hardware=h200_x1")
    res = run(cfg, [h200(0)], torch_probe=lambda: TorchView("2.13.0+cpu", None, 0))
    assert failed(res) == {
        "torch_devices": [
            "torch sees 0 CUDA device(s), NVML sees 1: torch 2.13.0+cpu is a CPU build: "
            "install a CUDA build of torch"
        ]
    }


def test_packages_missing_or_out_of_range(tmp_path):
    cfg = cfg_for(tmp_path)
    versions = {**VERSIONS, "speculators": None, "transformers": "5.21.0"}
    res = run(cfg, [], versions=versions)
    assert failed(res)["packages"] == [
        "transformers 5.21.0 is installed, need >=5.0,<=5.19.0: pip install "
        "'transformers>=5.0,<=5.19.0'",
        "speculators is not installed: pip install 'speculators>=0.9,<0.10'",
    ]
    # vLLM is only required when extraction uses it; local version labels are fine
    cfg.extract.backend = "vllm"
    res = run(cfg, [], versions={**VERSIONS, "torch": "2.14.1+cu128"})
    assert failed(res)["packages"] == ["vllm is not installed: pip install 'vllm>=0.33,<0.34'"]


def test_disk_too_small(tmp_path):
    cfg = cfg_for(
        tmp_path,
        "hardware=rtx_pro_6000_x8",
        "train.samples=100000",
        "data.source=hf",
        "data.path=org/big-chat-set",
    )  # not counted: 100,000
    res = run(cfg, [rtx(i) for i in range(8)], free_fn=lambda p: 40 * 10**9)
    (line,) = failed(res)["disk"]
    # tiny target, bf16: 4 x 128 x 2 B + 8 B token id per token, 512 tokens x 100,000
    hidden = 100_000 * 512 * (4 * 128 * 2 + 8)
    assert line.startswith(f"need 53.8 GB free under {cfg.data_dir}/, have 40.0 GB"), line
    assert f"hidden states {hidden / 1e9:.1f} GB upper bound" in line
    disk = res.metrics.disk
    assert isinstance(disk, DiskReading) and disk.fits is False
    assert disk.hidden_states_bytes == hidden and disk.bytes_per_token == 4 * 128 * 2


def test_a_target_that_cannot_be_found_is_the_failed_check(tmp_path, monkeypatch):
    """Not a failed disk estimate: the disk check, which reads the target's config, is
    not run at all."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    cfg = cfg_for(tmp_path, "model=kimi_k25")
    fails = failed(run(cfg, [], open_nvml=_no_driver))
    (line,) = fails["target"]
    assert "model.hub_id=moonshotai/Kimi-K2.5" in line and "model.path" in line
    assert "disk" not in fails


# --------------------------------------------------------------------------- CPU mode


def _no_driver():
    raise NoGpuDriver("no NVIDIA driver: the NVML library was not found")


def _no_vllm_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """As on a machine without ``.venv-vllm``: a real probe of it would fail the check."""
    from eagle3_pipeline.serving.env import ENV_VAR

    monkeypatch.setenv(ENV_VAR, str(tmp_path / "no-vllm-env" / "bin" / "python"))


CPU_ATTN = {  # vLLM 0.32's CPU build's answer for a float32 head of 32 (its selector's)
    "backend": "CPU_ATTN",
    "head_size_ok": True,
    "dtype_ok": True,
    "head_sizes": [32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512],
}


def test_cpu_mode_passes_for_the_cpu_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vLLM environment's readings are injected (the real ones: the slow test below),
    so this passes on a machine without one."""
    _no_vllm_environment(monkeypatch, tmp_path)
    asked: list[list[dict]] = []

    def selector(reading, queries):
        asked.append(queries)
        return [CPU_ATTN for _ in queries]

    res = run_preflight(
        PreflightInputs.from_config(cfg_for(tmp_path)),
        env={},
        open_nvml=_no_driver,
        free_fn=lambda p: PLENTY,
        versions=VERSIONS,
        vllm_probe=vllm_build(cpu=True),
        attention_probe=selector,
        cpu_probe=lambda: XEON_AMX,
    )
    assert res.passed and res.mode == "cpu"
    assert res.inventory == {"mode": "cpu", "cpu_bf16": "amx"}
    assert res.metrics.cpu == XEON_AMX
    assert [c.name for c in res.checks] == [
        "target",
        "data",
        "driver",
        "cpu",
        "packages",
        "disk",
        "vllm",
        "vllm_attention",
    ]
    vllm = res.metrics.vllm
    assert vllm is not None and vllm.cpu_build is True and vllm.version == "0.32.0+cpu"
    # vLLM's selector is asked about the draft's attention only (the MLA target's is not)
    assert asked == [[{"head_size": 32, "dtype": "float32", "num_heads": 4}]]
    assert res.checks[-1].reading == "the draft's head_dim=32 (train.draft.head_dim) -> CPU_ATTN"


@pytest.mark.slow
def test_cpu_mode_passes_with_the_real_vllm_environment(tmp_path: Path) -> None:
    """The same, with the installed vLLM environment probed: the CPU build, its CLI
    answering, and its own attention selector asked about the draft's head."""
    res = run_preflight(
        PreflightInputs.from_config(cfg_for(tmp_path)),
        env={},
        open_nvml=_no_driver,
        free_fn=lambda p: PLENTY,
        versions=VERSIONS,
    )
    assert res.passed, [c.problems for c in res.checks if not c.passed]
    vllm = res.metrics.vllm
    assert vllm is not None and vllm.cpu_build is True and vllm.cli_version
    assert res.checks[-1].name == "vllm_attention"
    assert "head_dim=32" in res.checks[-1].reading and "CPU_ATTN" in res.checks[-1].reading


@pytest.mark.slow
def test_a_head_size_vllm_refuses_is_refused_by_preflight_in_one_line(
    tmp_path, monkeypatch, capsys
):
    """A tiny Llama with 8 heads of 16 (vLLM's CPU attention takes 32, 64, ...): what
    used to fail at validate after training is refused before the target is built, with
    vLLM's own list (asked of the installed vLLM, not copied)."""
    import shutil

    from eagle3_pipeline.stages.preflight import main

    shutil.copytree(REPO / "conf", tmp_path / "conf")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["model=tiny_llama", "model.tiny.num_heads=8"])
    assert exc.value.code == 1
    out = capsys.readouterr()
    problems = [ln for ln in out.out.splitlines() if "head_dim=16" in ln]
    assert any("target tiny_llama head_dim=16" in ln and "32, 64" in ln for ln in problems)
    assert any("the draft's head_dim=16" in ln for ln in problems)
    last = out.err.strip().splitlines()[-1]  # the one line names the reason
    assert last.startswith("error: preflight: target tiny_llama head_dim=16: vLLM ")
    assert "(and 1 more, listed above)" in last
    assert not (tmp_path / "data/target").exists()


def test_cpu_mode_fails_when_the_profile_expects_gpus(tmp_path):
    cfg = cfg_for(tmp_path, "hardware=rtx_pro_6000_x8")
    res = run_preflight(
        PreflightInputs.from_config(cfg),
        env={},
        open_nvml=_no_driver,
        free_fn=lambda p: PLENTY,
        versions=VERSIONS,
        vllm_probe=vllm_build(cpu=False),
        cpu_probe=lambda: EPYC,
    )
    assert failed(res) == {
        "driver": [
            "no NVIDIA driver: the NVML library was not found, but hardware=rtx_pro_6000_x8 "
            "expects 8 GPU(s): run on the GPU machine or pass hardware=cpu"
        ]
    }
    assert res.inventory == {"mode": "cpu", "cpu_bf16": "none"}


def test_cpu_profile_on_a_gpu_machine_runs_on_cpu(tmp_path):
    busy = rtx(0, used=50_000, procs=(GpuProcess(1, "x", 50_000),))
    res = run(cfg_for(tmp_path), [busy])
    assert res.passed and res.inventory == {"mode": "cpu", "cpu_bf16": "none"}


# --------------------------------------------------------------------------- the stage


def _has_driver() -> bool:
    try:
        open_reader().close()
    except NoGpuDriver:
        return False
    return True


def test_vllm_environment_missing_or_of_the_wrong_build(tmp_path):
    from eagle3_pipeline.serving.env import VllmProbe

    missing = run(
        cfg_for(tmp_path, "hardware=h200_x1"),
        [h200(0)],
        vllm_probe=lambda cfg: VllmProbe(
            python="None", error="no vLLM environment: /x/.venv-vllm does not exist"
        ),
    )
    (line,) = failed(missing)["vllm"]
    assert "eagle3-vllm-env install" in line and "validate.vllm=false" in line
    wrong = run(cfg_for(tmp_path, "hardware=h200_x1"), [h200(0)], vllm_probe=vllm_build(cpu=True))
    (line,) = failed(wrong)["vllm"]
    assert "CPU build" in line and "needs the CUDA build" in line and "--device cuda" in line
    skipped = run(
        cfg_for(tmp_path, "hardware=h200_x1", "validate.vllm=false"),
        [h200(0)],
        vllm_probe=vllm_build(cpu=True),
    )
    assert "vllm" not in [c.name for c in skipped.checks]


def test_stage_writes_outputs_and_exit_codes(tmp_path, monkeypatch):
    """The stage on this machine's real probes, vLLM left out (validate.vllm=false, and
    no vLLM environment at all): what it writes and how it exits."""
    if _has_driver():
        pytest.skip("needs the driverless path (this machine has an NVIDIA driver)")
    from eagle3_pipeline.stages.preflight import main

    _no_vllm_environment(monkeypatch, tmp_path)
    monkeypatch.chdir(tmp_path)
    main(["--conf-dir", str(CONF), "validate.vllm=false"])  # cpu profile: passes
    inv = json.loads((tmp_path / "data/preflight/inventory.json").read_text())
    metrics = json.loads((tmp_path / "metrics/details/preflight.json").read_text())
    # this machine's own CPU: whatever it reports, the inventory names it and the details
    # hold the reading (the branches are tested on stated CPUs in tests/runtime/test_cpu.py)
    assert inv == {"mode": "cpu", "cpu_bf16": metrics["cpu"]["bf16"]}
    # the cores the stages may use: what eagle3-compare multiplies wall hours by
    assert isinstance(metrics["cpu"]["cores"], int) and metrics["cpu"]["cores"] >= 1
    assert metrics["checks"]["cpu"]["passed"] is True
    assert metrics["passed"] is True and metrics["checks"]["disk"]["passed"] is True
    assert metrics["packages"]["torch"] == importlib.metadata.version("torch")
    assert "vllm" not in metrics["checks"] and metrics["vllm"] is None

    with pytest.raises(SystemExit) as exc:
        main(["--conf-dir", str(CONF), "validate.vllm=false", "hardware=rtx_pro_6000_x8"])
    assert exc.value.code == 1
    failed_run = json.loads((tmp_path / "metrics/details/preflight.json").read_text())
    assert failed_run["passed"] is False
    assert [k for k, c in failed_run["checks"].items() if not c["passed"]] == ["driver"]

    # strict=false: the same failure is recorded, but the stage exits 0
    main(
        [
            "--conf-dir",
            str(CONF),
            "validate.vllm=false",
            "hardware=rtx_pro_6000_x8",
            "preflight.strict=false",
        ]
    )
    metrics = json.loads((tmp_path / "metrics/details/preflight.json").read_text())
    assert metrics["passed"] is False and metrics["strict"] is False
    assert metrics["checks"]["driver"]["passed"] is False


def test_stage_help():
    out = subprocess.run(
        [sys.executable, "-m", "eagle3_pipeline.stages.preflight", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "preflight" in out.stdout and "--params" in out.stdout


def test_an_mla_draft_vllms_cpu_kernel_cannot_run_is_refused_before_training(
    tmp_path: Path,
) -> None:
    """An MLA draft takes its target's latent width; on the CPU build vLLM's MLA kernel
    runs 576 (kv_lora_rank 512 + rope 64) only, and would fail only at validate."""
    from eagle3_pipeline.draft.shape import DraftShape
    from eagle3_pipeline.preflight.software import mla_draft_problem
    from eagle3_pipeline.targets.adapter import MlaDims

    cfg = cfg_for(tmp_path, "train.draft.layer_type=mla")
    shape = DraftShape("mla", 1, 128, 4, 4, 96, 256, 1e-6, 1024, MlaDims(64, 512, 32, 64, 32))
    assert mla_draft_problem(PreflightInputs.from_config(cfg), shape) is None
    narrow = dataclasses.replace(shape, mla=MlaDims(None, 256, 32, 32, 32))
    problem = mla_draft_problem(PreflightInputs.from_config(cfg), narrow)
    assert problem is not None and problem.startswith("train.draft.layer_type=mla:")
    assert "= 288" in problem and "takes 576 only" in problem
    assert (
        mla_draft_problem(PreflightInputs.from_config(cfg), dataclasses.replace(shape, mla=None))
        is None
    )


# --------------------------------------------------------------------------- precision


def _preflight(tmp_path: Path, cpu: CpuReading, *overrides: str):
    cfg = cfg_for(tmp_path, "validate.vllm=false", *overrides)
    return cfg, run_preflight(
        PreflightInputs.from_config(cfg),
        env={},
        open_nvml=_no_driver,
        free_fn=lambda p: PLENTY,
        versions=VERSIONS,
        vllm_probe=vllm_build(cpu=True),
        cpu_probe=lambda: cpu,
    )


@pytest.mark.parametrize(("cpu", "dtype"), [(XEON_AMX, "bfloat16"), (EPYC, "float32")])
def test_preflight_chooses_for_a_real_target_from_the_cpu(
    tmp_path: Path, cpu: CpuReading, dtype: str
) -> None:
    """SmolLM2 (a converted GGUF: a real target) on a CPU with and without native bf16:
    the choice is recorded in the details and written for the later stages."""
    from eagle3_pipeline.preflight.result import write_outputs

    cfg, res = _preflight(tmp_path, cpu, "model=smollm2_135m")
    assert res.precision is not None and res.precision.dtype == dtype
    assert res.metrics.precision == res.precision and res.metrics.cpu == cpu
    (cpu_check,) = [c for c in res.checks if c.name == "cpu"]
    assert cpu_check.reading.endswith(f"; the target in {dtype}")
    write_outputs(PreflightInputs.from_config(cfg), res)
    written = json.loads(Path(cfg.paths.precision).read_text())
    assert written == {"dtype": dtype, "why": res.precision.why}


def test_model_dtype_set_overrides_the_choice_in_the_table_only(tmp_path: Path) -> None:
    """model.dtype=float32 on an AMX CPU: the stages read the key (the file still holds
    the rule's choice for keys left null, e.g. train.dtype)."""
    _cfg, res = _preflight(tmp_path, XEON_AMX, "model=smollm2_135m", "model.dtype=float32")
    assert res.precision is not None and res.precision.dtype == "bfloat16"
    (cpu_check,) = [c for c in res.checks if c.name == "cpu"]
    assert cpu_check.reading.endswith("; the target in float32")


def test_the_tiny_default_stays_float32_on_an_amx_cpu(tmp_path: Path) -> None:
    _cfg, res = _preflight(tmp_path, XEON_AMX)
    assert res.precision == default_precision("cpu", True, None)
    assert res.precision is not None and res.precision.dtype == "float32"
