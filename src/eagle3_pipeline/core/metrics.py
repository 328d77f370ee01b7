"""Where each stage's figures go: a short headline that DVC shows, and the details.

Why two files: ``dvc metrics show`` and ``dvc exp show`` flatten every key of every
metrics file into one table. With GPU snapshots, per-position lists and timings in it, the
figures a user decides on (acceptance length, vLLM speedup, val loss, tokens/s, rows) are
lost. So each stage writes everything to ``metrics/details/<stage>.json`` -- an output DVC
does not flatten, read by the plan and by later stages -- and DVC's metrics are:

- ``metrics/<stage>.json`` for preflight and prepare: the record's headline fields
  (:func:`eagle3_pipeline.core.records.headline`), copied from the details (same values,
  never recomputed);
- dvclive's summary ``dvclive/<stage>/metrics.json`` for train and validate, written
  through :mod:`eagle3_pipeline.train.live` / :mod:`eagle3_pipeline.validate.live` from the
  same headline fields.

The headline is kept to what fits a terminal line or close to it: DVC puts every key of
every metrics file in one table, one column each (``dvc exp show`` prefixes a key two
files share with the file's path). So: preflight's verdict, rows, and -- from dvclive --
step, training tokens/s, val loss, acceptance length, vLLM speedup, losslessness. Target
and extract have no headline: their figures describe the target and the cost of a run,
not a choice between drafts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, TypeVar

from eagle3_pipeline.core.io import atomic_write_json
from eagle3_pipeline.core.records import Record

R = TypeVar("R", bound=Record)


class _DetailsDir(Protocol):
    @property
    def details(self) -> str: ...


class HasDetails(Protocol):
    """What the details' functions read: ``paths.details`` (a stage's view, or the whole
    config for a tool)."""

    @property
    def paths(self) -> _DetailsDir: ...


class HasMetrics(HasDetails, Protocol):
    """And where a stage without dvclive writes its headline: ``metrics_dir``."""

    @property
    def metrics_dir(self) -> str: ...


def details_path(cfg: HasDetails, stage: str) -> Path:
    """Every figure of ``stage``: what code and the plan read."""
    return Path(cfg.paths.details) / f"{stage}.json"


def headline_path(cfg: HasMetrics, record: type[Record]) -> Path:
    """The metrics file DVC shows for a stage without dvclive (train's and validate's
    headline is dvclive's summary, written by their ``live`` modules)."""
    if record.HEADLINE_IN_DVCLIVE:
        raise ValueError(f"{record.STAGE}'s headline is dvclive's summary, not {cfg.metrics_dir}")
    return Path(cfg.metrics_dir) / f"{record.STAGE}.json"


def write_details(cfg: HasDetails, record: Record, name: str | None = None) -> None:
    """The details, as ``name`` (default the record's stage): a stage whose headline is
    dvclive's, or that has none."""
    record.write(details_path(cfg, name or record.STAGE))


def write_stage_metrics(cfg: HasMetrics, record: Record) -> None:
    """Details first, then, for a stage without dvclive, the headline copied from them."""
    write_details(cfg, record)
    if record.headline_keys() and not record.HEADLINE_IN_DVCLIVE:
        atomic_write_json(headline_path(cfg, type(record)), record.headline())


def read_details(cfg: HasDetails, record: type[R]) -> R | None:
    """An earlier run's details of the stage that writes ``record``, or None when there
    is none; :class:`~eagle3_pipeline.core.records.RecordError` when it cannot be read."""
    return record.read_if_present(details_path(cfg, record.STAGE))


def open_live(directory: Path, resume: bool = False) -> Any:
    """dvclive's logger for one stage. It writes no dvc.yaml (the graph declares its files)
    and saves no experiment (a stage is part of one, not one itself)."""
    from dvclive import Live

    return Live(str(directory), resume=resume, dvcyaml=False, save_dvc_exp=False, report=None)
