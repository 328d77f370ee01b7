"""What each experiment's draft cost to make: the wall time of the stages that make it,
read from the experiment's own stage details at its commit.

Why from the details and not from ``dvc exp show``: the stages' times are figures of a run,
not headlines (``metrics/details/<stage>.json``, outputs with ``cache: false`` that each
experiment commit carries), and `dvc exp show` lists metrics files only. Reading them with
``git show <rev>:<path>`` gives the figures the stages wrote, never a recomputation.

The cost counts target, prepare, extract and train: what a user spends to get the draft.
Preflight is a check and validate a measurement (its serving passes dominate its time and
do not change the draft), so neither is counted. CPU-hours multiply the wall time by the
cores preflight read (its CPU record's ``cores``), since these stages use every core.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# (stage, key path of its wall time in its details): the stages that make the draft; a
# target is built (the tiny ones) or converted (a GGUF file), else only described
COST_STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("target", ("build_wall_s",)),
    ("target", ("gguf", "convert_s")),
    ("prepare", ("wall_s",)),
    ("extract", ("wall_s",)),
    ("train", ("wall_s",)),
)
DEFAULT_DETAILS = "metrics/details"


@dataclass(frozen=True)
class Cost:
    """One experiment's cost: wall hours of the stages that made its draft, per stage, and
    the cores preflight read (None where its record has none)."""

    stage_hours: dict[str, float]  # the stages whose details were found
    cores: int | None

    @property
    def hours(self) -> float | None:
        """Wall hours to the draft; None where the prepare, extract or train figure is
        missing (a partial sum would look cheaper than the run was)."""
        needed = {s for s, _ in COST_STAGES if s != "target"}
        if not needed <= set(self.stage_hours):
            return None
        return sum(self.stage_hours.values())

    @property
    def cpu_hours(self) -> float | None:
        h = self.hours
        return None if h is None or self.cores is None else h * self.cores


def _details(repo: Path, rev: str, path: str) -> Any:
    """A details file as the experiment left it: the work tree's for ``workspace``, else the
    commit's; None where the file is absent or not JSON."""
    if rev == "workspace":
        try:
            return json.loads((repo / path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return None
    proc = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=repo, capture_output=True, text=True
    )
    if proc.returncode != 0:
        return None
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        return None


def read_cost(repo: Path, rev: str, details_dir: str | None) -> Cost:
    """The cost of the experiment at ``rev`` (``workspace``: the work tree)."""
    base = (details_dir or DEFAULT_DETAILS).rstrip("/")
    hours: dict[str, float] = {}
    read: dict[str, Any] = {}
    for stage, keys in COST_STAGES:
        if stage not in read:
            read[stage] = _details(repo, rev, f"{base}/{stage}.json")
        value: Any = read[stage]
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            hours[stage] = hours.get(stage, 0.0) + float(value) / 3600.0
    preflight = _details(repo, rev, f"{base}/preflight.json")
    cpu = preflight.get("cpu") if isinstance(preflight, dict) else None
    cores = cpu.get("cores") if isinstance(cpu, dict) else None
    return Cost(hours, cores if isinstance(cores, int) and cores > 0 else None)
