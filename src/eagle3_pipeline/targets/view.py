"""What the target stage reads (its input view: see :mod:`eagle3_pipeline.core.inputs`)."""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_pipeline.core.choices import Device, Dtype
from eagle3_pipeline.core.config import (
    GgufSourceConfig,
    TargetStageConfig,
    TinyModelConfig,
    built_here,
)
from eagle3_pipeline.core.inputs import Inputs


@dataclass(frozen=True)
class TargetModel(Inputs):
    """The target model as the target stage reads it: what describing it reads (see
    :class:`~eagle3_pipeline.targets.adapter.TargetSource`), how it is built here (a tiny
    target, a GGUF file) and in which precision. Not ``model.fingerprint``: how preflight
    fingerprints the checkpoint, not what it is."""

    name: str
    path: str | None
    hub_id: str | None
    revision: str | None
    trust_remote_code: bool
    aux_layer_ids: list[int] | None
    tiny: TinyModelConfig | None
    gguf: GgufSourceConfig | None
    dtype: Dtype | None  # null: preflight's choice (paths.precision)

    @property
    def built_here(self) -> bool:
        return built_here(self.tiny, self.gguf)


@dataclass(frozen=True)
class TargetPaths(Inputs):
    target: str  # data/target: target.json, and the checkpoint it builds
    precision: str  # preflight's choice of precision (read where model.dtype is null)
    details: str


@dataclass(frozen=True)
class TargetHardware(Inputs):
    device: Device  # the precision rule's, where preflight wrote no choice


@dataclass(frozen=True)
class TargetInputs(Inputs):
    seed: int  # the tiny target's initialisation and data order
    model: TargetModel
    hardware: TargetHardware
    target: TargetStageConfig  # how the tiny target is trained
    paths: TargetPaths
