"""``metrics/details/preflight.json``: every reading and verdict of one preflight run.

Written on failure too (the record says which check failed and why). Read back by the
train stage, which compares NVML after its workers exited with :attr:`snapshot`.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_pipeline.core.records import Record, headline
from eagle3_pipeline.runtime.cpu import CpuReading
from eagle3_pipeline.runtime.gpu import GpuReading, GpuSnapshot
from eagle3_pipeline.runtime.precision import Precision


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


@dataclass(frozen=True)
class DiskReading:
    """The disk check's figures: the plan's need (hidden states + one checkpoint + the
    margin, :class:`~eagle3_pipeline.plan.resources.DiskNeed`) against the free space,
    and the storage estimate the hidden states' share comes from."""

    path: str  # the directory checked (preflight.disk_path, else data_dir)
    hidden_states_bytes: int  # the hidden states extract will write
    checkpoint_bytes: int  # one draft checkpoint
    margin_bytes: int  # preflight.min_free_disk_gb
    need_bytes: int  # their sum
    free_bytes: int  # free under path
    upper_bound: bool  # hidden_states_bytes bounds the need (no prepare record yet)
    fits: bool  # free_bytes >= need_bytes
    bytes_per_token: int  # one token's captured states
    total_tokens: float  # tokens whose states are stored (an estimate, so a float)
    basis: str  # where the tokens per conversation come from (measured or the bound)


@dataclass(frozen=True)
class DiskUnknown:
    """The disk check when the need cannot be estimated (the target's config unreadable)."""

    path: str  # the directory it would have checked
    error: str  # why the need cannot be estimated


@dataclass(frozen=True)
class VllmReading:
    """The vLLM environment's own answer (``serving.env.VllmProbe``), as preflight keeps it."""

    python: str  # the environment's interpreter
    version: str | None  # vLLM's version, None when it cannot be asked
    cpu_build: bool | None  # the CPU build (else CUDA), None when unknown
    cli_version: str | None  # what ``vllm --version`` answered
    import_s: float | None  # seconds the CLI took to answer (it imports vLLM)
    eagle3_options: list[str] | None  # EAGLE-3.1 draft options it reads, None: not asked
    error: str | None  # why the environment cannot be used, None when it can
    ok: bool  # error is None


@dataclass(kw_only=True)
class PreflightRecord(Record):
    STAGE = "preflight"

    passed: bool = headline()  # every check passed (the headline verdict)
    strict: bool  # preflight.strict: failures fail the stage (else warnings)
    failures: int  # problems found, over all checks
    mode: str  # "cuda" (the run uses GPUs) or "cpu"
    hardware: str  # the hardware profile's name (hardware.name)
    driver_version: str | None  # NVIDIA driver, None without one
    cuda_driver_version: str | None  # the CUDA version the driver supports (e.g. 12.9)
    no_driver: str | None  # why NVML could not be read, None when it could
    cuda_visible_devices: str | None  # CUDA_VISIBLE_DEVICES as the stage saw it
    cuda_device_order: str | None  # CUDA_DEVICE_ORDER as the stage saw it
    gpu_count_visible: int  # GPUs the run would use
    gpus: list[GpuReading]  # per visible GPU: NVML's reading (uuid, memory, processes)
    cpu: CpuReading  # the CPU: its model, bf16 flags, torch's report, native bf16 or none
    # the precision the later stages use where model.dtype / train.dtype are null, and why
    # (written to paths.precision, which they depend on)
    precision: Precision
    torch: TorchView | None  # torch's view of CUDA, None when not asked (cpu mode)
    packages: dict[str, str | None]  # installed version per package checked
    # the disk need vs free space (DiskUnknown: it cannot be estimated), None when the
    # check did not run (the target's files failed their check)
    disk: DiskReading | DiskUnknown | None
    vllm: VllmReading | None  # the vLLM environment probe, None when vLLM is not needed
    checks: dict[str, CheckVerdict]  # per check, by name
    snapshot: GpuSnapshot  # GPU memory and processes, compared after training
