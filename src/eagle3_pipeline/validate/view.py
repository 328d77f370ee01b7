"""What the validate stage reads (its input view: see :mod:`eagle3_pipeline.core.inputs`)."""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_pipeline.core.choices import DataSource, Device, Dtype
from eagle3_pipeline.core.config import (
    ServingConfig,
    ValidateConfig,
    VllmConfig,
    validate_runtime,
)
from eagle3_pipeline.core.inputs import Inputs


@dataclass(frozen=True)
class ValidateData(Inputs):
    """The training data as the model card names it."""

    source: DataSource
    path: str | None
    license: str
    regenerate: bool


@dataclass(frozen=True)
class ValidateTrain(Inputs):
    samples: int  # the model card's


@dataclass(frozen=True)
class ValidateModel(Inputs):
    dtype: Dtype  # the engines' precision off CPU


@dataclass(frozen=True)
class ValidateHardware(Inputs):
    device: Device
    gpu_count: int  # our evaluator's target placement
    serving: ServingConfig


@dataclass(frozen=True)
class ValidatePaths(Inputs):
    target: str
    heldout: str
    draft: str
    validate: str
    details: str
    live: str


@dataclass(frozen=True)
class ValidateInputs(Inputs):
    seed: int  # prompt subsets and sampled passes
    validate: ValidateConfig
    data: ValidateData
    train: ValidateTrain
    model: ValidateModel
    hardware: ValidateHardware
    vllm: VllmConfig
    paths: ValidatePaths

    def runtime(self) -> tuple[str, str]:
        """The engines' device and dtype (the settings' ranges were checked at compose)."""
        v = self.validate
        return validate_runtime(v.device, v.dtype, self.hardware.device, self.model.dtype)
