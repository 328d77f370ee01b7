"""Where each stage's figures go: a short headline that DVC shows, and the details.

Why two files: ``dvc metrics show`` and ``dvc exp show`` flatten every key of every
metrics file into one table. With GPU snapshots, per-position lists and timings in it, the
figures a user decides on (acceptance length, vLLM speedup, val loss, tokens/s, rows) are
lost. So each stage writes everything to ``metrics/details/<stage>.json`` -- an output DVC
does not flatten, read by the plan and by later stages -- and DVC's metrics are:

- ``metrics/<stage>.json`` for preflight and prepare: the keys of
  :data:`HEADLINE`, copied from the details (same values, never recomputed);
- dvclive's summary ``dvclive/<stage>/metrics.json`` for train and validate, written
  through :mod:`eagle3_pipeline.train.live` / :mod:`eagle3_pipeline.validate.live`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config import Config
from eagle3_pipeline.core.io import atomic_write_json

# The figures a user decides on, per stage. DVC puts every key of every metrics file in
# one table, one column each (``dvc exp show`` prefixes a key two files share with the
# file's path), so the whole headline is kept to what fits a terminal line or close to
# it: preflight's verdict, rows, and -- from dvclive -- step, training tokens/s, val loss,
# acceptance length, vLLM speedup, losslessness. Target and extract have no headline:
# their figures describe the target and the cost of a run, not a choice between drafts.
HEADLINE: dict[str, tuple[str, ...]] = {
    "preflight": ("passed",),
    "target": (),
    "prepare": ("rows",),
    "extract": (),
}


def details_path(cfg: Config, stage: str) -> Path:
    """Every figure of ``stage``: what code and the plan read."""
    return Path(cfg.paths.details) / f"{stage}.json"


def headline_path(cfg: Config, stage: str) -> Path:
    """The metrics file DVC shows for ``stage``."""
    if stage in HEADLINE:
        return Path(cfg.metrics_dir) / f"{stage}.json"
    return Path(cfg.paths.live) / stage / "metrics.json"


def headline(stage: str, details: dict[str, Any]) -> dict[str, Any]:
    """The :data:`HEADLINE` keys of ``details`` that the stage produced."""
    return {k: details[k] for k in HEADLINE[stage] if k in details}


def write_stage_metrics(cfg: Config, stage: str, details: dict[str, Any]) -> None:
    """Details first, then (for a stage without dvclive) the headline copied from them."""
    atomic_write_json(details_path(cfg, stage), details)
    if HEADLINE.get(stage):
        atomic_write_json(headline_path(cfg, stage), headline(stage, details))


def read_details(cfg: Config, stage: str) -> dict[str, Any] | None:
    """An earlier run's details of ``stage``, or None (absent or unreadable)."""
    try:
        data = json.loads(details_path(cfg, stage).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def open_live(directory: Path, resume: bool = False) -> Any:
    """dvclive's logger for one stage. It writes no dvc.yaml (the graph declares its files)
    and saves no experiment (a stage is part of one, not one itself)."""
    from dvclive import Live

    return Live(str(directory), resume=resume, dvcyaml=False, save_dvc_exp=False, report=None)
