"""Preflight: prove the machine is ready before any GPU work starts.

Reads the machine once (NVML, torch, package metadata, free disk, the vLLM environment),
runs every check of :mod:`~eagle3_pipeline.preflight.hardware`,
:mod:`~eagle3_pipeline.preflight.software` and :mod:`~eagle3_pipeline.preflight.disk`
against the hardware profile, and assembles the outputs of
:mod:`~eagle3_pipeline.preflight.result`. Every probe is a parameter so tests reproduce
any machine without its hardware.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from eagle3_pipeline.core.errors import ConfigError
from eagle3_pipeline.plan.resources import FreeBytesFn, free_bytes
from eagle3_pipeline.preflight.data import check_data_file
from eagle3_pipeline.preflight.disk import check_disk
from eagle3_pipeline.preflight.hardware import TorchView, check_driver, gpu_checks, torch_view
from eagle3_pipeline.preflight.init import check_init_source
from eagle3_pipeline.preflight.record import (
    CheckVerdict,
    DiskReading,
    DiskUnknown,
    PreflightRecord,
)
from eagle3_pipeline.preflight.result import Check, PreflightResult, inventory, write_outputs
from eagle3_pipeline.preflight.software import (
    attention_queries,
    check_packages,
    check_vllm,
    check_vllm_attention,
    mla_draft_problem,
    package_versions,
    probe_vllm,
    vllm_needed,
    vllm_reading,
)
from eagle3_pipeline.preflight.target import check_target_files
from eagle3_pipeline.preflight.view import PreflightInputs
from eagle3_pipeline.runtime.cpu import CpuReading, read_this_cpu
from eagle3_pipeline.runtime.gpu import (
    GpuError,
    GpuSnapshot,
    NoGpuDriver,
    NvmlReader,
    VisibleGpu,
    gpu_memory,
    gpu_reading,
    open_reader,
    read_all,
    select_visible,
)
from eagle3_pipeline.runtime.precision import chosen, default_precision


@dataclass
class _Machine:
    """What NVML said: the GPUs the run would use, or why there is no driver."""

    visible: list[VisibleGpu] = field(default_factory=list)
    no_driver: str | None = None
    driver: str | None = None
    cuda_driver: str | None = None
    checks: list[Check] = field(default_factory=list)  # a bad CUDA_VISIBLE_DEVICES


def _read_machine(
    reader: NvmlReader | None, open_nvml: Callable[[], NvmlReader], env: Mapping[str, str]
) -> _Machine:
    """``reader`` None: open the real NVML (absent driver -> CPU mode), and close it again."""
    m = _Machine()
    own = None
    if reader is None:
        try:
            reader = own = open_nvml()
        except NoGpuDriver as exc:
            m.no_driver = str(exc)
    try:
        if reader is not None:
            m.driver, m.cuda_driver = reader.driver_version(), reader.cuda_driver_version()
            try:
                m.visible = select_visible(
                    read_all(reader), env.get("CUDA_VISIBLE_DEVICES"), env.get("CUDA_DEVICE_ORDER")
                )
            except GpuError as exc:
                m.checks.append(Check("visible_devices", False, "invalid", [str(exc)]))
    finally:
        if own is not None and hasattr(own, "close"):
            own.close()
    return m


def run_preflight(
    cfg: PreflightInputs,
    reader: NvmlReader | None = None,
    env: Mapping[str, str] | None = None,
    torch_probe: Callable[[], TorchView] = torch_view,
    free_fn: FreeBytesFn = free_bytes,
    versions: dict[str, str | None] | None = None,
    open_nvml: Callable[[], NvmlReader] = open_reader,
    vllm_probe: Callable[[PreflightInputs], Any] = probe_vllm,
    attention_probe: Callable[[Any, list[dict[str, Any]]], Any] | None = None,
    cpu_probe: Callable[[], CpuReading] = read_this_cpu,
) -> PreflightResult:
    """All checks. ``reader`` None: open the real NVML (absent driver -> CPU mode)."""
    env = os.environ if env is None else env
    hw = cfg.hardware
    machine = _read_machine(reader, open_nvml, env)
    visible = machine.visible
    cpu = cpu_probe()
    # the CPU's capability decides a CPU run's precision (runtime.precision)
    precision = default_precision(hw.device, cfg.model.tiny is not None, cpu)
    target_precision = chosen("model.dtype", cfg.model.dtype, precision)
    checks = [
        check_driver(cfg, machine.no_driver, len(visible)),
        Check("cpu", True, f"{cpu.describe()}; the target in {target_precision.dtype}"),
        *machine.checks,
    ]
    use_gpus = hw.device == "cuda" and machine.no_driver is None
    view: TorchView | None = None
    if use_gpus:
        gpu, view = gpu_checks(cfg, visible, env, torch_probe)
        checks += gpu
    vers = package_versions() if versions is None else versions
    checks.append(check_packages(cfg, vers))
    target_check, fingerprint = check_target_files(cfg)
    data_check, data_fingerprint = check_data_file(cfg)
    init_check, init_fingerprint = check_init_source(cfg)
    checks[:0] = [target_check, data_check, *([init_check] if init_check else [])]
    disk_info: DiskReading | DiskUnknown | None = None
    if target_check.passed:  # the estimate reads the target's config
        disk_check, disk_info = check_disk(cfg, free_fn)
        checks.append(disk_check)
    probed = None
    if vllm_needed(cfg):
        probed = vllm_probe(cfg)
        checks.append(check_vllm(cfg, probed))
        if probed.ok and target_check.passed:
            checks.append(_attention_check(cfg, probed, attention_probe))

    mode = "cuda" if use_gpus and visible else "cpu"
    metrics = PreflightRecord(
        passed=all(c.passed for c in checks),
        strict=cfg.preflight.strict,
        failures=sum(len(c.problems) for c in checks),
        mode=mode,
        hardware=hw.name,
        driver_version=machine.driver,
        cuda_driver_version=machine.cuda_driver,
        no_driver=machine.no_driver,
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        cuda_device_order=env.get("CUDA_DEVICE_ORDER"),
        gpu_count_visible=len(visible),
        gpus=[gpu_reading(v) for v in visible],
        cpu=cpu,
        precision=precision,
        torch=view,
        packages=vers,
        disk=disk_info,
        vllm=vllm_reading(probed) if probed is not None else None,
        checks={c.name: CheckVerdict(c.passed, c.reading, c.problems) for c in checks},
        snapshot=GpuSnapshot(mode=mode, gpus=gpu_memory(visible)),
    )
    return PreflightResult(
        checks,
        mode,
        inventory(mode, visible, cpu),
        metrics,
        cfg.preflight.strict,
        visible,
        fingerprint,
        data_fingerprint,
        init_fingerprint,
        precision,
    )


def _attention_check(
    cfg: PreflightInputs, reading: Any, probe: Callable[[Any, list[dict[str, Any]]], Any] | None
) -> Check:
    """The target's and the draft's attention against the installed vLLM's selector
    (``probe``: ``serving.env.attention_support`` unless injected)."""
    from eagle3_pipeline.draft.shape import resolve_draft_shape
    from eagle3_pipeline.plan.target_info import load_target

    try:
        spec = load_target(cfg.model).spec
        draft = resolve_draft_shape(cfg.train.draft, spec)
    except ConfigError as exc:
        return Check("vllm_attention", False, "unknown", [str(exc)])
    queries = attention_queries(cfg, spec, draft)
    if probe is None:
        from eagle3_pipeline.serving.env import attention_support

        answers = attention_support(reading.python, [q for _, q in queries])
    else:
        answers = probe(reading, [q for _, q in queries])
    check = check_vllm_attention(cfg, reading, queries, answers)
    problem = mla_draft_problem(cfg, draft)
    if problem is not None:
        return Check("vllm_attention", False, check.reading, [*check.problems, problem])
    return check


def check_machine(cfg: PreflightInputs) -> PreflightResult:
    """Run every check on this machine and write the inventory and the metrics (written
    on failure too: the metrics say which check failed and why)."""
    result = run_preflight(cfg)
    write_outputs(cfg, result)
    return result
