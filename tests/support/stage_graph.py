"""The DVC graph as the tests see it: what each stage executes (the import closure of its
entrypoint), dvc.yaml and params.yaml parsed, ``${...}`` templating, and ``dvc status`` in a
copy of the repository. Shared by tests/pipeline/test_dvc_graph.py and tests/pipeline/test_params_deps.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from commands import dvc
from workdirs import repo_copy

from eagle3_pipeline.tools.graph import STAGES, executed_modules, imports, module_file

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"


# the one import-graph walker, the package's (eagle3-graph generates the code deps from it)
_module_file = module_file
__all__ = ["STAGES", "executed_modules", "imports", "module_file"]


def _graph() -> dict:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]


def _params() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))


_TEMPLATE = re.compile(r"\$\{([\w.]+)\}")


def _render(entry: str | dict, params: dict) -> str:
    """A dvc.yaml path entry with its ``${a.b}`` templates filled from params.yaml."""
    text = entry if isinstance(entry, str) else next(iter(entry))

    def value(m: re.Match[str]) -> str:
        node = params
        for key in m.group(1).split("."):
            node = node[key]
        return str(node)

    return _TEMPLATE.sub(value, text)


def templated_keys(spec: object) -> set[str]:
    """The params keys a stage's dvc.yaml entry names as ``${key}`` (anywhere in it)."""
    if isinstance(spec, str):
        return set(_TEMPLATE.findall(spec))
    if isinstance(spec, dict):
        return set().union(set(), *(templated_keys(k) | templated_keys(v) for k, v in spec.items()))
    if isinstance(spec, list):
        return set().union(set(), *(templated_keys(v) for v in spec))
    return set()


# --------------------------------------------------------------------------- dvc status


def _dvc(cwd: Path, *args: str) -> str:
    return dvc(cwd, *args, timeout=300).stdout


def _stale(cwd: Path) -> set[str]:
    status = json.loads(_dvc(cwd, "status", "--json"))
    return {
        name
        for name, changes in status.items()
        if any(isinstance(c, dict) and "changed deps" in c for c in changes)
    }


def make_locked_copy(root: Path) -> Path:
    """A copy of the repository's tracked files whose dvc.lock records the current code
    and params, with placeholder outputs (only dependencies are under test here)."""
    root = repo_copy(root)
    params = _params()
    for spec in _graph().values():
        for kind in ("outs", "metrics", "plots"):
            for entry in spec.get(kind, []):
                p = root / _render(entry, params)
                if p.suffix:
                    p.parent.mkdir(parents=True, exist_ok=True)
                    p.write_text("{}\n")
                else:
                    p.mkdir(parents=True, exist_ok=True)
                    (p / "placeholder").write_text("x\n")
    _dvc(root, "commit", "--force", "--quiet")
    assert _stale(root) <= {"preflight"}  # always_changed aside, everything is current
    return root
