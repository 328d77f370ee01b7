"""What the validate stage reads (its input view: see :mod:`eagle3_pipeline.core.inputs`)."""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_pipeline.core.choices import DataSource, Device, Dtype
from eagle3_pipeline.core.config import (
    ServingConfig,
    TinyModelConfig,
    ValidateConfig,
    VllmConfig,
)
from eagle3_pipeline.core.inputs import Inputs
from eagle3_pipeline.runtime.precision import Precision, model_precision, set_by


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
    dtype: Dtype | None  # the target's: the engines' (on a CPU the speed's; null: preflight's)
    tiny: TinyModelConfig | None  # a tiny target stays float32 (preflight's rule)


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
    precision: str  # preflight's choice of precision (read where model.dtype is null)
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
        device, precision = self.precision()
        return device, precision.dtype

    def precision(self) -> tuple[str, Precision]:
        """The engines' device and precision with its reason: ``validate.dtype``, else
        float32 on a CPU (where vLLM's counters and our evaluator agree exactly: the
        proof), else the target's (``model.dtype``, else preflight's choice)."""
        v = self.validate
        device = v.device or self.hardware.device
        if v.dtype is not None:
            return device, set_by("validate.dtype", v.dtype)
        if device == "cpu":
            return device, Precision(
                "float32", "float32 on a CPU, where vLLM and our evaluator agree exactly"
            )
        return device, self.target_precision(device)

    def serving_precision(self) -> Precision:
        """The precision vLLM's speed figures are measured in: what a user serves the target
        in. ``validate.dtype`` where set (the proof's too: one pair of engines), else the
        target's (``model.dtype``, else preflight's choice) on every device. Off CPU it is
        the proof's precision; on a CPU it differs from the proof's float32 where the target
        resolved to bf16 (a real target on a CPU with native bf16), and validate then runs a
        second pair of engines for the speed (:mod:`eagle3_pipeline.validate.engines`)."""
        v = self.validate
        if v.dtype is not None:
            return set_by("validate.dtype", v.dtype)
        return self.target_precision(v.device or self.hardware.device)

    def target_precision(self, device: str) -> Precision:
        """The target's precision: ``model.dtype``, else preflight's choice."""
        m = self.model
        return model_precision(m.dtype, device, m.tiny is not None, self.paths.precision)
