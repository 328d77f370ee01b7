"""The stage input views (:mod:`eagle3_pipeline.core.inputs`) are what the stages read.

Both directions, as dvc.yaml's ``params:`` need them:

- a stage reads nothing it does not declare: the code below ``stages/`` never sees the
  whole config (no module a stage runs, other than its entrypoint and the config module
  itself, imports ``Config`` or a loader of it), so a read of an undeclared key is an
  attribute its view lacks, which mypy reports (CI runs mypy; a test below shows it does);
- a stage declares nothing it does not read: every leaf of its view is read somewhere, as
  mypy types the reads (tests/support/view_reads.py);

and ``eagle3-graph`` writes ``params:`` from the views (tests/pipeline/test_dvc_graph.py checks
that dvc.yaml is what it writes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from stage_graph import ROOT, STAGES
from view_reads import Reads, mypy_reads, unread

from eagle3_pipeline.tools.graph import import_refs, inputs_view, params

# What a module below stages/ may not import from the config module: the whole config, or
# what builds it.
WHOLE_CONFIG = {"Config", "load_config", "load_params", "compose", "config_from_cli"}
# Modules that may: where the config and the views are defined, the stage entrypoints
# (each builds its view) and the tools (they read the whole config for a user).
MAY_SEE_CONFIG = ("core/config/", "core/inputs.py", "stages/", "tools/")
PKG_DIR = ROOT / "src" / "eagle3_pipeline"


def whole_config_imports(source: str, module: str = "eagle3_pipeline.x") -> list[str]:
    """``line: name`` of each import of :data:`WHOLE_CONFIG` from the config module."""
    return [
        f"{ref.line}: {n}"
        for ref in import_refs(module, source)
        if ref.module.startswith("eagle3_pipeline.core.config")
        for n in ref.names
        if n in WHOLE_CONFIG
    ]


def test_every_stage_has_a_view() -> None:
    assert all(inputs_view(stage) is not None for stage in STAGES)


def test_no_module_below_the_stages_sees_the_whole_config() -> None:
    bad = []
    for path in sorted(PKG_DIR.rglob("*.py")):
        rel = path.relative_to(PKG_DIR).as_posix()
        if not rel.startswith(MAY_SEE_CONFIG):
            dotted = rel.removesuffix(".py").removesuffix("__init__").rstrip("/")
            module = ".".join(["eagle3_pipeline", *dotted.split("/")]).rstrip(".")
            text = path.read_text(encoding="utf-8")
            bad += [f"{rel}:{hit}" for hit in whole_config_imports(text, module)]
    assert not bad, f"these take the whole config, not a stage's view: {bad}"


def test_the_import_rule_can_fail() -> None:
    src = "from eagle3_pipeline.core.config import ConfigError, Config as C\n"
    assert whole_config_imports(src) == ["1: Config"]
    assert whole_config_imports("from eagle3_pipeline.core.config import TrainConfig\n") == []


@pytest.mark.parametrize("stage", STAGES)
def test_params_are_the_views_keys(stage: str) -> None:
    """The stage's params in dvc.yaml: its view's keys less the templated ones (a key
    both listed and templated would be tracked twice, one listed nowhere not at all)."""
    graph = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    assert graph[stage]["params"] == params(stage, graph[stage])
    view = inputs_view(stage)
    assert set(graph[stage]["params"]) <= set(view.keys())


@pytest.fixture(scope="module")
def reads(tmp_path_factory: pytest.TempPathFactory) -> Reads:
    return mypy_reads(tmp_path_factory.mktemp("mypy"))


@pytest.mark.integration
@pytest.mark.parametrize("stage", STAGES)
def test_every_declared_key_is_read(reads: Reads, stage: str) -> None:
    missing = unread(inputs_view(stage), reads)
    assert not missing, f"{stage} declares keys its code never reads: {missing}"


@pytest.mark.integration
def test_an_unread_key_is_reported(reads: Reads) -> None:
    """The check can fail: drop the one read of validate's ``train.samples`` (the model
    card's) and it is reported, although preflight's estimate reads a ``samples`` through
    a Protocol that validate's view would satisfy (validate's is never passed as it)."""
    from eagle3_pipeline.validate.view import ValidateInputs

    read = "eagle3_pipeline.validate.view.ValidateTrain.samples"
    assert read in reads.fields
    assert "eagle3_pipeline.plan.resources._Samples.samples" in reads.fields
    less = Reads(reads.fields - {read}, reads.passes)
    assert unread(ValidateInputs, less) == ["train.samples"]


@pytest.mark.integration
def test_a_whole_section_read_in_part_is_reported_down_to_its_leaves(reads: Reads) -> None:
    """validate declares the ``validate`` section whole: each of its keys must be read, not
    just the section (drop the reads of ``k_sweep`` and that key is reported); a field a
    section inherits (``model.gguf.path`` from ``PinnedFileConfig``) counts where declared."""
    from eagle3_pipeline.preflight.view import PreflightInputs
    from eagle3_pipeline.validate.view import ValidateInputs

    read = "eagle3_pipeline.core.config.schema.ValidateConfig.k_sweep"
    assert read in reads.fields
    assert unread(ValidateInputs, Reads(reads.fields - {read}, reads.passes)) == [
        "validate.k_sweep"
    ]
    inherited = "eagle3_pipeline.core.config.schema.PinnedFileConfig.path"
    assert "model.gguf.path" not in unread(PreflightInputs, reads)
    less = Reads(reads.fields - {inherited}, reads.passes)
    assert "model.gguf.path" in unread(PreflightInputs, less)


@pytest.mark.integration
def test_a_read_through_a_protocol_counts_for_the_view_passed_as_it(reads: Reads) -> None:
    """``build_engine`` reads ``hardware.serving`` through a Protocol: validate's view is
    passed as it, so its ``hardware.serving`` is read; without that call it would not be."""
    from eagle3_pipeline.validate.view import ValidateInputs

    passes = {(a, p) for a, p in reads.passes if p.endswith("engine.EngineInputs")}
    assert (
        "eagle3_pipeline.validate.view.ValidateInputs",
        "eagle3_pipeline.serving.engine.EngineInputs",
    ) in passes
    assert "hardware.serving" not in unread(ValidateInputs, reads)
    alone = Reads(reads.fields, reads.passes - passes)
    assert "hardware.serving" in unread(ValidateInputs, alone)


@pytest.mark.integration
def test_an_undeclared_read_is_a_type_error(tmp_path: Path) -> None:
    """What keeps a stage from reading a key it does not declare: its view has no such
    attribute, and mypy (CI) says so, naming it."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from eagle3_pipeline.validate.view import ValidateInputs\n\n\n"
        "def epochs(inputs: ValidateInputs) -> int:\n"
        "    return inputs.train.epochs\n",
        encoding="utf-8",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports", "silent", str(probe)],
        cwd=ROOT,
        env={**os.environ, "MYPYPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stdout
    assert '"ValidateTrain" has no attribute "epochs"' in proc.stdout, proc.stdout
