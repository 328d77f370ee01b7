"""A parameter's path through train reads in one direction: the plan reads the stage's
input view once, the run takes the plan, the record is built from the plan and the run.

Why a test: when a module of the run reaches back to the view (``cfg.train.x`` deep in
the loop), a setting has two readers and the plan's checks no longer cover what runs."""

from __future__ import annotations

import inspect

import pytest

from eagle3_pipeline.tools.graph import import_refs
from eagle3_pipeline.train.loop import DraftTrainer
from eagle3_pipeline.train.plan import TrainPlan
from eagle3_pipeline.train.run import run_record, train

PKG = "eagle3_pipeline.train"
# the planning side: what reads the view (the stage's entry, the launcher, a torchrun
# worker, and the plan with the checks it runs)
PLANNING = {"launch", "worker", "plan", "runtime", "inputs", "view", "online", "nodes"}
RUN = [
    "run",
    "loop",
    "state",
    "batches",
    "live",
    "select",
    "save",
    "optim",
    "losses",
    "metrics",
    "prefetch",
    "distributed",
    "record",
]


@pytest.mark.parametrize("module", RUN)
def test_the_run_side_never_reads_the_input_view_or_plans_again(module: str) -> None:
    back = [
        f"{ref.module}:{ref.line}"
        for ref in import_refs(f"{PKG}.{module}")
        if ref.module in (f"{PKG}.view", "eagle3_pipeline.core.inputs")
        or "plan_training" in ref.names
        or (
            ref.module.startswith(f"{PKG}.")
            and ref.module.rsplit(".", 1)[1] in {"launch", "worker"}
        )
    ]
    assert not back, f"{PKG}.{module} runs after the plan; it reaches back to {back}"


def test_every_train_module_is_on_one_side() -> None:
    from eagle3_pipeline.tools.graph import module_file

    here = module_file(f"{PKG}.run")
    assert here is not None
    names = {p.stem for p in here.parent.glob("*.py")} - {"__init__", "errors", "warm_start"}
    assert names == PLANNING | set(RUN), names ^ (PLANNING | set(RUN))


@pytest.mark.parametrize("entry", [train, run_record, DraftTrainer.__init__])
def test_the_run_takes_the_plan_not_the_view(entry: object) -> None:
    hints = inspect.get_annotations(entry, eval_str=True)  # type: ignore[arg-type]
    assert "cfg" not in hints and all("Inputs" not in str(t) for t in hints.values()), hints
    if entry is not run_record:
        assert TrainPlan in hints.values(), hints
