"""What the train stage reads (its input view: see :mod:`eagle3_pipeline.core.inputs`)."""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_pipeline.core.choices import Device, Dtype
from eagle3_pipeline.core.config import TinyModelConfig, TrainConfig
from eagle3_pipeline.core.inputs import Inputs


@dataclass(frozen=True)
class TrainModel(Inputs):
    name: str  # recorded in the details
    tiny: TinyModelConfig | None  # a tiny target trains in float32 (preflight's rule)


@dataclass(frozen=True)
class TrainHardware(Inputs):
    name: str  # recorded in the details
    device: Device
    gpu_count: int
    train_dtype: Dtype
    nodes: int  # torchrun's node count
    gpu_memory_mib: int | None  # DDP or FSDP under train.parallel=auto


@dataclass(frozen=True)
class TrainPathsInputs(Inputs):
    target: str
    prepared: str
    hidden_states: str
    draft: str
    precision: str  # preflight's choice of precision (read where train.dtype is null on CPU)
    train_state: str  # the resume state's place (not an output: dvc.yaml says why)
    details: str
    live: str


@dataclass(frozen=True)
class TrainInputs(Inputs):
    seed: int
    train: TrainConfig
    model: TrainModel
    hardware: TrainHardware
    paths: TrainPathsInputs
