"""What the prepare stage reads (its input view: see :mod:`eagle3_pipeline.core.inputs`)."""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_pipeline.core.choices import Device, Dtype, FingerprintMode
from eagle3_pipeline.core.config import (
    DataConfig,
    GgufSourceConfig,
    ServingConfig,
    TinyModelConfig,
    VllmConfig,
    built_here,
)
from eagle3_pipeline.core.inputs import Inputs, cache_place


@dataclass(frozen=True)
class PrepareTrain(Inputs):
    samples: int  # how many training conversations


@dataclass(frozen=True)
class PrepareModel(Inputs):
    """What identifies the target in the regeneration cache's key, and how it generates."""

    path: str | None
    hub_id: str | None
    tiny: TinyModelConfig | None  # the tiny tokenizer's reasoning markers
    gguf: GgufSourceConfig | None
    fingerprint: FingerprintMode  # how a local target's weights enter the key
    dtype: Dtype | None  # regeneration's precision (null: preflight's choice)

    @property
    def built_here(self) -> bool:
        return built_here(self.tiny, self.gguf)


@dataclass(frozen=True)
class PrepareHardware(Inputs):
    device: Device
    serving: ServingConfig  # a regeneration server this stage starts


@dataclass(frozen=True)
class PreparePaths(Inputs):
    target: str
    prepared: str
    heldout: str
    bad_lines: str
    precision: str  # preflight's choice of precision (read where model.dtype is null)
    details: str
    cache: str = cache_place()


@dataclass(frozen=True)
class PrepareInputs(Inputs):
    seed: int  # the held-out split, the sample of conversations
    data: DataConfig
    train: PrepareTrain
    model: PrepareModel
    hardware: PrepareHardware
    vllm: VllmConfig
    paths: PreparePaths
    metrics_dir: str  # the headline's place
