"""What the preflight stage reads (its input view: see :mod:`eagle3_pipeline.core.inputs`).

Preflight checks the machine against the whole run, so it reads a little of every stage's
configuration: what each needs of the GPUs, the disk, the vLLM environment and the files
it will open."""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_pipeline.core.choices import Device, Dtype, ExtractBackend, ExtractMode
from eagle3_pipeline.core.config import (
    DataConfig,
    DraftShapeConfig,
    ModelConfig,
    PreflightConfig,
    validate_runtime,
)
from eagle3_pipeline.core.inputs import Inputs, cache_place
from eagle3_pipeline.runtime.precision import chosen, default_precision


@dataclass(frozen=True)
class PreflightHardware(Inputs):
    """The hardware profile the machine is checked against."""

    name: str
    device: Device
    gpu_count: int
    gpu_name: str | None
    gpu_memory_mib: int | None
    memory_tolerance_mib: int
    min_compute_capability: float | None
    idle_memory_mib: int
    expected_processes: list[str]
    train_dtype: Dtype  # the draft's memory estimate


@dataclass(frozen=True)
class PreflightExtract(Inputs):
    dtype: Dtype  # the hidden states' size on disk
    backend: ExtractBackend  # whether extraction needs vLLM
    mode: ExtractMode


@dataclass(frozen=True)
class PreflightTrain(Inputs):
    """What sizes the hidden states and the draft, and the warm start's source."""

    samples: int
    speculative_tokens: int
    draft_vocab_size: int
    tokens_per_step: int
    dtype: Dtype | None
    draft: DraftShapeConfig  # also what vLLM must accept of the draft
    init_from: str | None


@dataclass(frozen=True)
class PreflightValidate(Inputs):
    vllm: bool  # whether validation needs vLLM
    device: Device | None
    dtype: Dtype | None


@dataclass(frozen=True)
class PreflightVllm(Inputs):
    python: str | None  # the vLLM environment probed


@dataclass(frozen=True)
class PreflightPaths(Inputs):
    inventory: str
    target_fingerprint: str
    data_fingerprint: str
    init_fingerprint: str
    precision: str  # the precision chosen for the later stages (written here)
    details: str
    cache: str = cache_place()


@dataclass(frozen=True)
class PreflightInputs(Inputs):
    seed: int  # the sample of conversations the storage estimate counts
    data_dir: str  # the disk checked, unless preflight.disk_path
    preflight: PreflightConfig
    model: ModelConfig
    hardware: PreflightHardware
    data: DataConfig
    extract: PreflightExtract
    train: PreflightTrain
    validate: PreflightValidate
    vllm: PreflightVllm
    paths: PreflightPaths
    metrics_dir: str

    def validate_runtime(self) -> tuple[str, str]:
        """The device and dtype validate will ask of vLLM."""
        v = self.validate
        return validate_runtime(v.device, v.dtype, self.hardware.device, self.target_dtype())

    def target_dtype(self) -> str:
        """The target's precision as the later stages will resolve it (``model.dtype``,
        else the rule; the CPU's capability matters only where validate's null dtype
        does not already mean float32, i.e. off the CPU)."""
        rule = default_precision(self.hardware.device, self.model.tiny is not None, None)
        return chosen("model.dtype", self.model.dtype, rule).dtype
