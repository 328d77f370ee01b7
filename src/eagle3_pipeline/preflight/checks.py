"""Preflight: prove the machine is ready before any GPU work starts.

Why: a multi-hour job on 8 GPUs launched after eyeballing ``nvidia-smi`` finds out an hour
later that another process held memory on one card, that the disk cannot hold the hidden
states, or that the torch build cannot see the GPUs. Each of those is a check here against
the hardware profile (``conf/hardware/*.yaml``), with one actionable line per failure.

Two outputs with different lifetimes (DESIGN.md section 1): a stable *inventory* that
downstream stages depend on -- profile-level facts only (GPU model, count, memory size,
compute capability, or "cpu"), so reruns and identical nodes share the cache -- and
*metrics* with the volatile readings (memory in use, processes, UUIDs, versions) and the
verdict of each check.

It stays fast: package versions come from metadata (speculators and vLLM are never
imported); torch is imported only for a CUDA profile, to count the devices it sees.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config import Config, ConfigError
from eagle3_pipeline.core.io import atomic_write_json
from eagle3_pipeline.plan.resources import (
    FreeBytesFn,
    disk_need,
    estimate_draft,
    estimate_storage,
    fmt_gb,
    free_bytes,
    load_target,
)
from eagle3_pipeline.preflight.gpu import (
    GpuError,
    NoGpuDriver,
    NvmlReader,
    VisibleGpu,
    gpu_record,
    open_reader,
    read_all,
    select_visible,
)

# Installed-version requirements checked from package metadata (pyproject.toml's ranges).
PACKAGES: dict[str, str] = {
    "torch": ">=2.9,<=2.14.1",
    "transformers": ">=5.0,<=5.19.0",
    "speculators": ">=0.9,<0.10",
    "vllm": ">=0.33,<0.34",
}


@dataclass
class Check:
    """One verdict: ``reading`` for the table, one actionable line per problem."""

    name: str
    passed: bool
    reading: str
    problems: list[str] = field(default_factory=list)


@dataclass
class TorchView:
    version: str | None
    cuda: str | None  # the CUDA version torch was built with; None for a CPU build
    device_count: int
    error: str | None = None


@dataclass
class PreflightResult:
    checks: list[Check]
    mode: str  # "cpu" | "cuda"
    inventory: dict[str, Any]
    metrics: dict[str, Any]
    strict: bool = True
    visible: list[VisibleGpu] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def problems(self) -> list[str]:
        return [p for c in self.checks for p in c.problems]


# --------------------------------------------------------------------------- probes


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


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


# --------------------------------------------------------------------------- checks


def _mib(n: int | float) -> str:
    return f"{n:,.0f} MiB"


def _profile(cfg: Config) -> str:
    return f"hardware={cfg.hardware.name}"


def check_driver(cfg: Config, no_driver: str | None, n_visible: int) -> Check:
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


def check_count(cfg: Config, visible: list[VisibleGpu], env: Mapping[str, str]) -> Check:
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


def check_model(cfg: Config, visible: list[VisibleGpu]) -> Check:
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


def check_memory(cfg: Config, visible: list[VisibleGpu]) -> Check:
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


def check_capability(cfg: Config, visible: list[VisibleGpu]) -> Check:
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


def check_idle(cfg: Config, visible: list[VisibleGpu]) -> Check:
    """Idle: no compute process other than the declared ones, and memory in use (minus
    what declared processes hold) at most ``hardware.idle_memory_mib``."""
    hw = cfg.hardware
    limit, expected = hw.idle_memory_mib, list(hw.expected_processes)
    problems: list[str] = []
    busy: list[str] = []
    for v in visible:
        g = v.info
        foreign = [p for p in g.processes if not _expected(p.name, p.pid, expected)]
        declared_mib = sum(
            p.used_mib or 0 for p in g.processes if _expected(p.name, p.pid, expected)
        )
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
        if foreign or unexplained > limit:
            busy.append(v.label)
    reading = (
        f"all idle (<= {limit:,} MiB used"
        + (f", expected: {', '.join(expected)}" if expected else "")
        + ")"
        if not busy
        else "busy: " + ", ".join(busy)
    )
    return Check("gpu_idle", not problems, reading, problems)


def check_torch(cfg: Config, view: TorchView, n_visible: int) -> Check:
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


def _version_in(version: str, spec: str) -> bool:
    """PEP 440 range check; True when ``packaging`` is missing or a version is unparsable
    (presence is still checked)."""
    try:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        from packaging.version import InvalidVersion, Version
    except ImportError:
        return True
    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return True


def check_packages(cfg: Config, versions: dict[str, str | None]) -> Check:
    """Required: torch, transformers, speculators; vLLM only for ``extract.backend=vllm``."""
    problems: list[str] = []
    for name, spec in PACKAGES.items():
        have = versions.get(name)
        required = name != "vllm" or cfg.extract.backend == "vllm"
        if have is None:
            if required:
                problems.append(f"{name} is not installed: pip install '{name}{spec}'")
            continue
        if not _version_in(have, spec):
            problems.append(f"{name} {have} is installed, need {spec}: pip install '{name}{spec}'")
    reading = ", ".join(f"{k} {v or '-'}" for k, v in versions.items())
    return Check("packages", not problems, reading, problems)


def vllm_needed(cfg: Config) -> bool:
    """Whether any stage of this run starts vLLM."""
    return bool(cfg.validate.vllm or cfg.extract.backend == "vllm"
                or (cfg.data.regenerate and cfg.data.regenerate_backend == "server"
                    and cfg.data.server.start))


def probe_vllm(cfg: Config) -> Any:
    from eagle3_pipeline.serving.env import VllmEnvError, VllmProbe, find_python, probe

    try:
        return probe(find_python(cfg.vllm.python))
    except VllmEnvError as exc:
        return VllmProbe(python=str(cfg.vllm.python), error=str(exc))


def check_vllm(cfg: Config, result: Any) -> Check:
    """The vLLM environment imports, the CLI answers, and it is the build this hardware
    needs (the CPU build on CPU profiles, a CUDA build on GPU profiles)."""
    if result.error:
        return Check("vllm", False, "missing", [
            f"vLLM environment: {result.error}; install it with `eagle3-vllm-env install` "
            "(or set validate.vllm=false to skip vLLM)"])
    want_cpu = cfg.hardware.device == "cpu"
    reading = f"vllm {result.version} ({'CPU' if result.cpu_build else 'CUDA'} build)"
    if bool(result.cpu_build) != want_cpu:
        return Check("vllm", False, reading, [
            f"vLLM environment {result.python}: {reading}, but hardware={cfg.hardware.name} "
            f"needs the {'CPU' if want_cpu else 'CUDA'} build "
            f"(`eagle3-vllm-env install --device {'cpu' if want_cpu else 'cuda'}`)"])
    return Check("vllm", True, reading)


def check_disk(cfg: Config, free_fn: FreeBytesFn) -> tuple[Check, dict[str, Any]]:
    """Free space vs hidden states + checkpoint + margin (the plan's numbers)."""
    where = cfg.preflight.disk_path or cfg.data_dir
    try:
        target = load_target(cfg.model)
        storage = estimate_storage(cfg, target)
        need = disk_need(cfg, storage, estimate_draft(cfg, target), free_fn, path=where)
    except ConfigError as exc:
        return (
            Check("disk", False, "cannot estimate", [f"disk: cannot estimate the need: {exc}"]),
            {"path": where, "error": str(exc)},
        )
    reading = (
        f"{fmt_gb(need.free_bytes)} free under {need.path}/, need {fmt_gb(need.need_bytes)} "
        f"(hidden states {fmt_gb(need.hidden_states_bytes)}"
        f"{' upper bound' if need.upper_bound else ''} + checkpoint "
        f"{fmt_gb(need.checkpoint_bytes)} + margin {fmt_gb(need.margin_bytes)})"
    )
    problem = need.problem()
    info = {
        **need.to_dict(),
        "bytes_per_token": storage.bytes_per_token,
        "total_tokens": storage.total_tokens,
        "basis": storage.basis,
    }
    return Check("disk", problem is None, reading, [problem] if problem else []), info


# --------------------------------------------------------------------------- the run


def inventory(mode: str, visible: list[VisibleGpu]) -> dict[str, Any]:
    """Profile-level facts only (no UUIDs, driver versions or readings): identical nodes
    and reruns with other memory use produce the same file and share DVC's cache."""
    if mode == "cpu":
        return {"mode": "cpu"}
    groups: dict[tuple[str, int, str], int] = {}
    for v in visible:
        key = (v.info.name, v.info.memory_total_mib, v.info.cc_str)
        groups[key] = groups.get(key, 0) + 1
    return {
        "mode": "cuda",
        "gpu_count": len(visible),
        "gpus": [
            {"name": n, "memory_total_mib": m, "compute_capability": cc, "count": c}
            for (n, m, cc), c in sorted(groups.items())
        ],
    }


def run_preflight(
    cfg: Config,
    reader: NvmlReader | None = None,
    env: Mapping[str, str] | None = None,
    torch_probe: Callable[[], TorchView] = torch_view,
    free_fn: FreeBytesFn = free_bytes,
    versions: dict[str, str | None] | None = None,
    open_nvml: Callable[[], NvmlReader] = open_reader,
    vllm_probe: Callable[[Config], Any] = probe_vllm,
) -> PreflightResult:
    """All checks. ``reader`` None: open the real NVML (absent driver -> CPU mode)."""
    env = os.environ if env is None else env
    hw = cfg.hardware
    no_driver: str | None = None
    own = None
    if reader is None:
        try:
            reader = own = open_nvml()
        except NoGpuDriver as exc:
            no_driver = str(exc)
    checks: list[Check] = []
    visible: list[VisibleGpu] = []
    driver = cuda_driver = None
    try:
        if reader is not None:
            driver, cuda_driver = reader.driver_version(), reader.cuda_driver_version()
            try:
                visible = select_visible(
                    read_all(reader), env.get("CUDA_VISIBLE_DEVICES"), env.get("CUDA_DEVICE_ORDER")
                )
            except GpuError as exc:
                checks.append(Check("visible_devices", False, "invalid", [str(exc)]))
    finally:
        if own is not None and hasattr(own, "close"):
            own.close()
    checks.insert(0, check_driver(cfg, no_driver, len(visible)))
    use_gpus = hw.device == "cuda" and no_driver is None
    view: TorchView | None = None
    if use_gpus:
        checks += [
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
    vers = package_versions() if versions is None else versions
    checks.append(check_packages(cfg, vers))
    disk_check, disk_info = check_disk(cfg, free_fn)
    checks.append(disk_check)
    vllm_reading = None
    if vllm_needed(cfg):
        vllm_reading = vllm_probe(cfg)
        checks.append(check_vllm(cfg, vllm_reading))

    mode = "cuda" if use_gpus and visible else "cpu"
    inv = inventory(mode, visible)
    records = [gpu_record(v) for v in visible]
    passed = all(c.passed for c in checks)
    metrics = {
        "passed": passed,
        "strict": cfg.preflight.strict,
        "failures": sum(len(c.problems) for c in checks),
        "mode": mode,
        "hardware": hw.name,
        "driver_version": driver,
        "cuda_driver_version": cuda_driver,
        "no_driver": no_driver,
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
        "cuda_device_order": env.get("CUDA_DEVICE_ORDER"),
        "gpu_count_visible": len(visible),
        "gpus": records,
        "torch": asdict(view) if view else None,
        "packages": vers,
        "disk": disk_info,
        "vllm": vllm_reading.to_dict() if vllm_reading is not None else None,
        "checks": {
            c.name: {"passed": c.passed, "reading": c.reading, "problems": c.problems}
            for c in checks
        },
        # the train stage compares its post-training reading with this one
        "snapshot": {
            "mode": mode,
            "gpus": [
                {
                    "cuda_index": r["cuda_index"],
                    "uuid": r["uuid"],
                    "memory_used_mib": r["memory_used_mib"],
                    "processes": r["processes"],
                }
                for r in records
            ],
        },
    }
    return PreflightResult(checks, mode, inv, metrics, cfg.preflight.strict, visible)


def render(result: PreflightResult) -> str:
    """The table printed on success and on failure, then one line per problem."""
    lines: list[str] = []
    if result.visible:
        lines.append(
            f"{'cuda':>4}  {'nvml':>4}  {'name':<44} {'used / total':>22}  cc    mig  procs"
        )
        for v in result.visible:
            g = v.info
            procs = ", ".join(
                f"{p.pid}:{p.name or '?'}"
                + (f" {p.used_mib:,}MiB" if p.used_mib is not None else "")
                for p in g.processes
            )
            lines.append(
                f"{v.cuda_index:>4}  {g.index:>4}  {g.name[:44]:<44} "
                f"{f'{g.memory_used_mib:,} / {g.memory_total_mib:,} MiB':>22}  {g.cc_str:<5} "
                f"{'on ' if g.mig_enabled else 'off'}  {procs or '-'}"
            )
        lines.append("")
    width = max(len(c.name) for c in result.checks)
    fail_word = "FAIL" if result.strict else "WARN"
    for c in result.checks:
        lines.append(f"{c.name:<{width}}  {'ok  ' if c.passed else fail_word}  {c.reading}")
    problems = result.problems
    if problems:
        lines.append("")
        lines += [f"{fail_word}: {p}" for p in problems]
    verdict = "passed" if result.passed else ("FAILED" if result.strict else "passed with warnings")
    lines.append(f"preflight {verdict} (mode {result.mode}, {len(result.checks)} checks)")
    return "\n".join(lines)


def inventory_path(cfg: Config) -> Path:
    return Path(cfg.paths.inventory)


def write_outputs(cfg: Config, result: PreflightResult, metrics_file: Path) -> None:
    atomic_write_json(inventory_path(cfg), result.inventory)
    atomic_write_json(metrics_file, result.metrics)
