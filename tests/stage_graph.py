"""The DVC graph as the tests see it: what each stage executes (the import closure of its
entrypoint), dvc.yaml and params.yaml parsed, ``${...}`` templating, and ``dvc status`` in a
copy of the repository. Shared by tests/test_dvc_graph.py and tests/test_params_deps.py."""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml
from workdirs import repo_copy

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
STAGES = ("preflight", "target", "prepare", "extract", "train", "validate")


@functools.cache
def _module_file(name: str) -> Path | None:
    p = SRC / name.replace(".", "/")
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").is_file() else None


@functools.cache
def _imports(name: str) -> frozenset[str]:
    """Package modules ``name`` imports, at any depth of its code (lazy imports included),
    plus modules named in strings (``python -m eagle3_pipeline.X`` workers, the vLLM
    connector's module path): a subprocess runs them for the stage too; and a package's
    every module when it discovers them (``pkgutil.iter_modules(__path__)``)."""
    path = _module_file(name)
    assert path is not None, name
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = name.split(".")
                base = parts if is_pkg else parts[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith("eagle3_pipeline."):
                found.add(node.value.split(":")[0])
        elif (
            is_pkg
            and isinstance(node, ast.Call)
            and ast.unparse(node.func).endswith("iter_modules")
            and "__path__" in ast.unparse(node)
        ):
            # a registry that imports every module of its package (targets.families)
            found.update(
                f"{name}.{p.stem}" for p in path.parent.glob("*.py") if p.stem != "__init__"
            )
    out: set[str] = set()
    for mod in found:
        parts = mod.split(".")
        if parts[0] != "eagle3_pipeline":
            continue
        while parts and _module_file(".".join(parts)) is None:
            parts.pop()
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return frozenset(out)


def executed_modules(stage: str) -> set[str]:
    seen: set[str] = set()
    todo = [f"eagle3_pipeline.stages.{stage}"]
    while todo:
        mod = todo.pop()
        if mod not in seen:
            seen.add(mod)
            todo.extend(_imports(mod) - seen)
    return seen


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
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "dvc", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"dvc {' '.join(args)}: {proc.stderr[-2000:]}"
    return proc.stdout


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
