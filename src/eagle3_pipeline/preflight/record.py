"""``metrics/details/preflight.json``: every reading and verdict of one preflight run.

Written on failure too (the record says which check failed and why). Read back by the
train stage, which compares NVML after its workers exited with :attr:`snapshot`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eagle3_pipeline.core.records import Record, headline
from eagle3_pipeline.runtime.gpu import GpuSnapshot


@dataclass
class TorchView:
    """torch's own view of the devices (it honours CUDA_VISIBLE_DEVICES like the run)."""

    version: str | None  # torch's version, None when it cannot be imported
    cuda: str | None  # the CUDA version torch was built with; None for a CPU build
    device_count: int  # devices torch sees
    error: str | None = None  # why torch could not be asked, None when it could


@dataclass(frozen=True)
class CheckVerdict:
    """One check's verdict, as the table shows it."""

    passed: bool  # no problem found
    reading: str  # what was read, for the table
    problems: list[str]  # one actionable line each


@dataclass(kw_only=True)
class PreflightRecord(Record):
    STAGE = "preflight"

    passed: bool = headline()  # every check passed (the headline verdict)
    strict: bool  # preflight.strict: failures fail the stage (else warnings)
    failures: int  # problems found, over all checks
    mode: str  # "cuda" (the run uses GPUs) or "cpu"
    hardware: str  # the hardware profile's name (hardware.name)
    driver_version: str | None  # NVIDIA driver, None without one
    cuda_driver_version: Any  # the CUDA version the driver supports (NVML's value)
    no_driver: str | None  # why NVML could not be read, None when it could
    cuda_visible_devices: str | None  # CUDA_VISIBLE_DEVICES as the stage saw it
    cuda_device_order: str | None  # CUDA_DEVICE_ORDER as the stage saw it
    gpu_count_visible: int  # GPUs the run would use
    gpus: list[dict[str, Any]]  # per visible GPU: NVML's reading (uuid, memory, processes)
    torch: TorchView | None  # torch's view of CUDA, None when not asked (cpu mode)
    packages: dict[str, str | None]  # installed version per package checked
    disk: dict[str, Any] | None  # the disk need vs free space, None when not estimated
    vllm: dict[str, Any] | None  # the vLLM environment probe, None when vLLM is not needed
    checks: dict[str, CheckVerdict]  # per check, by name
    snapshot: GpuSnapshot  # GPU memory and processes, compared after training
