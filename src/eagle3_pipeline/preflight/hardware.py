"""Checks of the visible GPUs (and torch's view of them) against the hardware profile.

Why each is its own function: a multi-hour job on 8 GPUs launched after eyeballing
``nvidia-smi`` finds out an hour later that another process held memory on one card or
that the torch build cannot see the GPUs. Each such cause gets one check against
``conf/hardware/*.yaml`` and one actionable line per GPU that fails it.

torch is imported only by :func:`torch_view`, which runs for a CUDA profile only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from eagle3_pipeline.preflight.record import TorchView
from eagle3_pipeline.preflight.result import Check
from eagle3_pipeline.preflight.view import PreflightInputs
from eagle3_pipeline.runtime.gpu import GpuInfo, VisibleGpu


def torch_view() -> TorchView:
    """torch's own view of the devices (it honours CUDA_VISIBLE_DEVICES like the run)."""
    try:
        import torch
    except ImportError as exc:
        return TorchView(None, None, 0, f"torch is not importable: {exc}")
    try:
        count = int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception as exc:  # a broken CUDA setup must be a failed check, not a crash
        return TorchView(torch.__version__, torch.version.cuda, 0, f"{type(exc).__name__}: {exc}")
    return TorchView(str(torch.__version__), torch.version.cuda, count)


def _mib(n: int | float) -> str:
    return f"{n:,.0f} MiB"


def _profile(cfg: PreflightInputs) -> str:
    return f"hardware={cfg.hardware.name}"


def check_driver(cfg: PreflightInputs, no_driver: str | None, n_visible: int) -> Check:
    hw = cfg.hardware
    if no_driver is None:
        note = "" if hw.device == "cuda" else " (cpu profile: the run does not use them)"
        return Check("driver", True, f"NVML ok, {n_visible} GPU(s) visible{note}")
    if hw.device == "cpu":
        return Check("driver", True, f"CPU mode ({no_driver})")
    return Check(
        "driver",
        False,
        f"CPU mode ({no_driver})",
        [
            f"{no_driver}, but {_profile(cfg)} expects {hw.gpu_count} GPU(s): run on the GPU "
            "machine or pass hardware=cpu"
        ],
    )


def check_count(cfg: PreflightInputs, visible: list[VisibleGpu], env: Mapping[str, str]) -> Check:
    want, have = cfg.hardware.gpu_count, len(visible)
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    where = f" (CUDA_VISIBLE_DEVICES={cvd})" if cvd is not None else ""
    reading = f"{have} visible{where}, {want} expected"
    if have == want:
        return Check("gpu_count", True, reading)
    fix = (
        "check CUDA_VISIBLE_DEVICES and nvidia-smi"
        if have < want
        else f"set CUDA_VISIBLE_DEVICES to the {want} GPU(s) this run should use"
    )
    return Check(
        "gpu_count",
        False,
        reading,
        [f"{have} GPU(s) visible{where}, {_profile(cfg)} expects {want}: {fix}"],
    )


def check_model(cfg: PreflightInputs, visible: list[VisibleGpu]) -> Check:
    hw = cfg.hardware
    names = sorted({v.info.name for v in visible})
    if not hw.gpu_name:
        return Check("gpu_model", True, ", ".join(names) or "-")
    bad = [v for v in visible if hw.gpu_name.lower() not in v.info.name.lower()]
    return Check(
        "gpu_model",
        not bad,
        f"{', '.join(names) or '-'} (expected '{hw.gpu_name}')",
        [
            f"{v.label}: {v.info.name} is not a '{hw.gpu_name}' ({_profile(cfg)}): pick the "
            "hardware profile of this machine or exclude it with CUDA_VISIBLE_DEVICES"
            for v in bad
        ],
    )


def check_memory(cfg: PreflightInputs, visible: list[VisibleGpu]) -> Check:
    hw = cfg.hardware
    totals = sorted({v.info.memory_total_mib for v in visible})
    reading = ", ".join(_mib(t) for t in totals) or "-"
    if hw.gpu_memory_mib is None:
        return Check("gpu_memory", True, reading)
    tol = hw.memory_tolerance_mib
    bad = [v for v in visible if abs(v.info.memory_total_mib - hw.gpu_memory_mib) > tol]
    return Check(
        "gpu_memory",
        not bad,
        f"{reading} (expected {hw.gpu_memory_mib:,} +- {tol:,} MiB)",
        [
            f"{v.label}: {_mib(v.info.memory_total_mib)} total, {_profile(cfg)} expects "
            f"{hw.gpu_memory_mib:,} +- {tol:,} MiB"
            + (" (MIG instance?)" if v.info.mig_enabled else "")
            for v in bad
        ],
    )


def check_capability(cfg: PreflightInputs, visible: list[VisibleGpu]) -> Check:
    need = cfg.hardware.min_compute_capability
    ccs = sorted({v.info.cc_str for v in visible})
    reading = ", ".join(ccs) or "-"
    if need is None:
        return Check("compute_capability", True, reading)
    bad = [v for v in visible if v.info.cc + 1e-9 < need]
    return Check(
        "compute_capability",
        not bad,
        f"{reading} (min {need})",
        [
            f"{v.label}: compute capability {v.info.cc_str} < {need} required by {_profile(cfg)}"
            for v in bad
        ],
    )


def check_mig(visible: list[VisibleGpu]) -> Check:
    on = [v for v in visible if v.info.mig_enabled]
    problems = []
    for v in on:
        if v.mig_uuid:
            continue  # a MIG instance selected on purpose; the memory check judges its size
        problems.append(
            f"{v.label}: MIG mode is enabled, the run needs whole GPUs: disable it "
            f"(sudo nvidia-smi -i {v.info.index} -mig 0) or exclude it with CUDA_VISIBLE_DEVICES"
        )
    reading = "off" if not on else "on: " + ", ".join(v.label for v in on)
    return Check("mig", not problems, reading, problems)


def check_compute_mode(visible: list[VisibleGpu]) -> Check:
    modes = sorted({v.info.compute_mode for v in visible})
    bad = [v for v in visible if v.info.compute_mode == "prohibited"]
    return Check(
        "compute_mode",
        not bad,
        ", ".join(modes) or "-",
        [
            f"{v.label}: compute mode is PROHIBITED (no CUDA context can be created): "
            f"sudo nvidia-smi -i {v.info.index} -c DEFAULT"
            for v in bad
        ],
    )


def _expected(proc_name: str | None, pid: int, expected: list[str]) -> bool:
    for e in expected:
        e = str(e).strip()
        if not e:
            continue
        if e == str(pid) or (proc_name and e.lower() in proc_name.lower()):
            return True
    return False


def _idle_problems(v: VisibleGpu, limit: int, expected: list[str]) -> tuple[list[str], bool]:
    """(problem lines, busy) for one GPU: foreign processes are named one by one; memory
    nobody visible here explains (another container) is reported only when none is."""
    g: GpuInfo = v.info
    foreign = [p for p in g.processes if not _expected(p.name, p.pid, expected)]
    declared_mib = sum(p.used_mib or 0 for p in g.processes if _expected(p.name, p.pid, expected))
    problems = []
    for p in foreign:
        used = p.used_mib if p.used_mib is not None else g.memory_used_mib
        problems.append(
            f"{v.label}: {used:,} MiB used by {p.label()}: stop it or set CUDA_VISIBLE_DEVICES"
        )
    unexplained = g.memory_used_mib - declared_mib
    if not foreign and unexplained > limit:
        problems.append(
            f"{v.label}: {g.memory_used_mib:,} MiB used by processes not visible here "
            "(another container?): free the GPU or set CUDA_VISIBLE_DEVICES"
        )
    return problems, bool(foreign) or unexplained > limit


def check_idle(cfg: PreflightInputs, visible: list[VisibleGpu]) -> Check:
    """Idle: no compute process other than the declared ones, and memory in use (minus
    what declared processes hold) at most ``hardware.idle_memory_mib``."""
    hw = cfg.hardware
    limit, expected = hw.idle_memory_mib, list(hw.expected_processes)
    problems: list[str] = []
    busy: list[str] = []
    for v in visible:
        lines, is_busy = _idle_problems(v, limit, expected)
        problems += lines
        if is_busy:
            busy.append(v.label)
    reading = (
        f"all idle (<= {limit:,} MiB used"
        + (f", expected: {', '.join(expected)}" if expected else "")
        + ")"
        if not busy
        else "busy: " + ", ".join(busy)
    )
    return Check("gpu_idle", not problems, reading, problems)


def check_torch(cfg: PreflightInputs, view: TorchView, n_visible: int) -> Check:
    reading = (
        f"torch {view.version or '-'} (CUDA {view.cuda or 'none'}) sees {view.device_count}, "
        f"NVML {n_visible}"
    )
    if view.error:
        return Check("torch_devices", False, reading, [f"torch: {view.error}"])
    if view.device_count == n_visible:
        return Check("torch_devices", True, reading)
    if view.cuda is None:
        fix = f"torch {view.version} is a CPU build: install a CUDA build of torch"
    else:
        fix = "check the driver / CUDA runtime compatibility and CUDA_VISIBLE_DEVICES"
    return Check(
        "torch_devices",
        False,
        reading,
        [f"torch sees {view.device_count} CUDA device(s), NVML sees {n_visible}: {fix}"],
    )


def gpu_checks(
    cfg: PreflightInputs,
    visible: list[VisibleGpu],
    env: Mapping[str, str],
    torch_probe: Callable[[], TorchView],
) -> tuple[list[Check], TorchView]:
    """Every check of a CUDA profile on a machine with a driver, in table order."""
    checks = [
        check_count(cfg, visible, env),
        check_model(cfg, visible),
        check_memory(cfg, visible),
        check_capability(cfg, visible),
        check_mig(visible),
        check_compute_mode(visible),
        check_idle(cfg, visible),
    ]
    view = torch_probe()
    checks.append(check_torch(cfg, view, len(visible)))
    return checks, view
