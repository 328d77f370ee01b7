"""What the extract stage reads (its input view: see :mod:`eagle3_pipeline.core.inputs`)."""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_pipeline.core.choices import Device, Dtype
from eagle3_pipeline.core.config import (
    ExtractConfig,
    ServingConfig,
    TinyModelConfig,
    VllmConfig,
)
from eagle3_pipeline.core.inputs import Inputs


@dataclass(frozen=True)
class ExtractModel(Inputs):
    aux_layer_ids: list[int] | None  # must agree with target.json's (a stale target)
    dtype: Dtype | None  # the target's precision (null: preflight's choice)
    tiny: TinyModelConfig | None  # a tiny target stays float32 (preflight's rule)


@dataclass(frozen=True)
class ExtractHardware(Inputs):
    name: str  # recorded in the manifest (a reuse key)
    device: Device
    gpu_count: int
    serving: ServingConfig


@dataclass(frozen=True)
class ExtractPaths(Inputs):
    target: str
    prepared: str
    hidden_states: str
    precision: str  # preflight's choice of precision (read where model.dtype is null)
    details: str


@dataclass(frozen=True)
class ExtractInputs(Inputs):
    seed: int  # the vLLM engine's
    extract: ExtractConfig
    model: ExtractModel
    hardware: ExtractHardware
    vllm: VllmConfig
    paths: ExtractPaths
