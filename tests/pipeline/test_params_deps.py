"""dvc.yaml's ``params:`` are the stages' declared inputs, and an edit of params.yaml stales
exactly the stages that declare the key.

Each stage declares what it reads in its input view (:mod:`eagle3_pipeline.core.inputs`):
``eagle3-graph`` writes ``params:`` from the views and tests/pipeline/test_stage_inputs.py checks
both directions (a module a stage runs never sees the whole config, so mypy refuses a read
the view lacks; every declared key is read). Here: every key of the schema is declared by
a stage, templated into one, or known to be read by none; and DVC, asked about an edit,
stales the stages the views predict.

How dvc.yaml lists a key: a section (``vllm``: DVC tracks every key under it) or a dotted
key (``train.epochs``). A section that may be null (``model.tiny``, ``model.gguf``) is
listed whole: a key under it would be missing from params.yaml whenever it is null. A key
templated into a stage's own entries (``${paths.draft}``) is tracked by DVC through the
templating and is not listed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

import pytest
import yaml
from stage_graph import STAGES, _dvc, _graph, make_locked_copy, templated_keys

from eagle3_pipeline.core.config import Config
from eagle3_pipeline.tools.graph import inputs_view


def schema_leaves(cls: Any = Config, prefix: str = "") -> set[str]:
    """Every dotted key of the config schema (a section's keys, not the section)."""
    out: set[str] = set()
    hints = get_type_hints(cls)
    for f in fields(cls):
        t = hints[f.name]
        inner = [a for a in getattr(t, "__args__", ()) if a is not type(None)]
        sub = (
            t
            if is_dataclass(t)
            else (inner[0] if len(inner) == 1 and is_dataclass(inner[0]) else None)
        )
        if sub is not None:
            out |= schema_leaves(sub, f"{prefix}{f.name}.")
        else:
            out.add(f"{prefix}{f.name}")
    return out


def readers(key: str) -> set[str]:
    """The stages whose view declares ``key`` (or a section holding it)."""
    return {
        stage
        for stage in STAGES
        if any(k == key or key.startswith(k + ".") for k in inputs_view(stage).keys())
    }


def test_keys_read_by_no_stage_are_known() -> None:
    """Keys no stage declares or templates: each is a tool's, a label, or dead. A new one
    fails here, to be read, moved or removed."""
    graph = _graph()
    declared = {k for stage in STAGES for k in inputs_view(stage).keys()}
    declared |= {t for stage in STAGES for t in templated_keys(graph[stage])}
    unread = {
        k
        for k in schema_leaves()
        if k not in declared and not any(k.startswith(d + ".") for d in declared)
    }
    assert unread == {
        # eagle3-plan's estimates
        "hardware.throughput.extract_tokens_per_s",
        "hardware.throughput.train_conversations_per_s",
        "hardware.throughput.source",
    }, sorted(unread)


# --------------------------------------------------------------------------- dvc status


def _changed_params(root: Path) -> dict[str, set[str]]:
    """``dvc status``'s changed params.yaml keys, by stage."""
    status = json.loads(_dvc(root, "status", "--json"))
    out: dict[str, set[str]] = {}
    for stage, changes in status.items():
        for change in changes:
            if isinstance(change, dict):
                params = (change.get("changed deps") or {}).get("params.yaml")
                if params:
                    out.setdefault(stage, set()).update(params)
    return out


def _downstream(graph: dict, stages: set[str]) -> set[str]:
    """The stages a rerun of ``stages`` reruns: those and every stage fed by their outs."""
    from stage_graph import _params, _render

    params = _params()
    outs = {
        name: {_render(o, params) for o in spec.get("outs", [])} for name, spec in graph.items()
    }
    found = set(stages)
    while True:
        more = {
            name
            for name, spec in graph.items()
            if name not in found
            and any(_render(d, params) in outs[up] for up in found for d in spec["deps"])
        }
        if not more:
            return found
        found |= more


@pytest.mark.slow
def test_params_edits_stale_exactly_the_stages_that_read_them(tmp_path: Path) -> None:
    """Against a dvc.lock that records the current code and params: an edit of a key
    stales the stages whose view declares it (and they rerun what they feed); an edit
    of a hardware profile that conf/config.yaml does not choose, recomposed, stales none."""
    t0 = time.monotonic()
    root = make_locked_copy(tmp_path / "repo")
    assert _changed_params(root) == {}
    params = root / "params.yaml"
    original = params.read_text(encoding="utf-8")

    key = "hardware.gpu_memory_mib"
    predicted = readers(key)
    assert "train" in predicted and not predicted & {"target", "prepare", "extract"}, predicted
    assert "  gpu_memory_mib: null\n" in original
    params.write_text(
        original.replace("  gpu_memory_mib: null\n", "  gpu_memory_mib: 143771\n"), encoding="utf-8"
    )
    changed = _changed_params(root)
    assert set(changed) == predicted, changed
    assert all(keys == {key} for keys in changed.values()), changed
    # preflight's own run does not change its outputs with the profile's memory: train
    # reruns, and validate after it (the draft it reads)
    assert _downstream(_graph(), predicted - {"preflight"}) == {"train", "validate"}
    params.write_text(original, encoding="utf-8")
    assert _changed_params(root) == {}

    conf = yaml.safe_load((root / "conf/config.yaml").read_text(encoding="utf-8"))
    chosen = next(
        d["hardware"] for d in conf["defaults"] if isinstance(d, dict) and "hardware" in d
    )
    inactive = sorted(p for p in (root / "conf/hardware").glob("*.yaml") if p.stem != chosen)
    assert inactive, "no inactive hardware profile to edit"
    profile = inactive[0]
    data = yaml.safe_load(profile.read_text(encoding="utf-8"))
    assert isinstance(data.get("gpu_memory_mib"), int), profile
    data["gpu_memory_mib"] -= 1024
    profile.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    subprocess.run(
        [sys.executable, "-m", "eagle3_pipeline.tools.compose"],
        cwd=root,
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert params.read_text(encoding="utf-8") == original
    assert _changed_params(root) == {}
    print(f"dvc staleness checks: {time.monotonic() - t0:.0f}s")
