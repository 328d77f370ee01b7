"""What the report and the model card say beside the record's figures: which target,
which data under which licence, the draft's shape, the serve command, package versions.

Why not in :class:`~eagle3_pipeline.validate.record.ValidateRecord`: these are facts the
stage looks up (the target's identity, the draft's own config.json, installed versions),
not figures it measures; the record stays what ``dvc metrics`` and ``eagle3-compare`` read.
The report is rendered from the record and these facts, both typed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TargetFacts:
    """The target as the report names it."""

    id: str  # its hub id, or its name and local path
    name: str  # the short name (titles)
    hub_id: str | None  # the hub id (the model card's base_model)
    revision: str | None  # the pinned revision
    vllm_architecture: str | None  # vLLM's class name for it
    aux_layer_ids: list[int]  # the layers the draft reads


@dataclass(frozen=True)
class DataFacts:
    """The training data as configured."""

    source: str  # data.source
    path: str | None  # data.path
    license: str  # data.license
    regenerate: bool  # whether the target regenerated the assistant turns
    samples: int  # train.samples: the conversations asked for


@dataclass(frozen=True)
class DraftFacts:
    """The draft's shape, read from its own config.json."""

    shape: dict[str, int | str] | None  # the transformer layer's type and sizes
    vocab_size: int | None  # the draft vocabulary


@dataclass(frozen=True)
class ReportFacts:
    """Everything the report prints that is not a measured figure."""

    draft_dir: str  # where the draft is
    target: TargetFacts  # the target
    data: DataFacts  # the training data
    draft: DraftFacts  # the draft's shape
    serve_command: str | None  # the checkpoint validator's vllm serve command
    findings: list[str]  # the checkpoint validator's warnings and errors, one line each
    seed: int  # the run's seed
    versions: dict[str, str | None]  # installed package versions
