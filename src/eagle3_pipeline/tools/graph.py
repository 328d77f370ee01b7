"""``eagle3-graph``: each stage's code deps in ``dvc.yaml``, generated from the import graph.

Why generated: a stage must rerun when code it executes changes, and only then. Listing
whole subpackages by hand made every stage depend on tools it never runs (editing
``eagle3-fetch`` reran target training, regeneration and extraction) and went stale
silently when a module started importing another subpackage. Here a stage's code deps are
exactly the files of the modules its entrypoint can execute: every import at any depth of
the code (lazy ones included, since a lazy import hides a dependency, it does not remove
it), modules named in strings (``python -m eagle3_pipeline.X`` workers and the vLLM
connector's module path run for the stage in a subprocess), and every module of a package
that discovers its modules (``pkgutil.iter_modules(__path__)``: the family registry). A
directory is listed whole when every module under it is executed, so a new module there
shows up as a difference. ``eagle3-graph --check`` exits 1 when ``dvc.yaml`` differs from
what this would write (a test runs it).

A stage's file deps (``${paths.target}``, ``${paths.init_fingerprint}``) are written by hand:
a fingerprint stands for content outside the repository that the stage reads by another
name (train reads ``train.init_from``, never ``paths.init_fingerprint``), so neither the
import graph nor the input views can derive them. They are checked instead
(:func:`dataflow_problems`, run by ``eagle3-graph`` and its ``--check``): every cached
output feeds some stage unless it is an end product (:data:`END_PRODUCTS`), and a stage
whose view reads another stage's cached output depends on it. A fingerprint written and
never depended on is an edit that reruns nothing.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eagle3_pipeline.core.io import atomic_write_text

PKG = "eagle3_pipeline"
SRC = Path(__file__).resolve().parents[2]  # the directory holding the package
STAGES = ("preflight", "target", "prepare", "extract", "train", "validate")

_TEMPLATE = re.compile(r"\$\{([^}]+)\}")

# The cached outputs no stage depends on, and why: what the pipeline makes for people.
# Every other cached output must be some stage's dep (:func:`dataflow_problems`).
END_PRODUCTS = {
    "${paths.validate}": "validate's report and model card, read by people",
    "${paths.bad_lines}": "the data lines prepare dropped, for a person to read",
}


@functools.cache
def module_file(name: str) -> Path | None:
    """The file of package module ``name`` (a package's ``__init__.py``), or None."""
    p = SRC / name.replace(".", "/")
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").is_file() else None


@functools.cache
def _tree(name: str) -> ast.Module:
    """Module ``name``'s syntax tree, parsed once for both walkers below."""
    path = module_file(name)
    if path is None:
        raise ValueError(f"{name}: not a module of {PKG}")
    return ast.parse(path.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class ImportRef:
    """One import statement of a module, at any depth of its code (lazy ones included)."""

    module: str  # what it imports from, absolute (a relative import made absolute)
    names: tuple[str, ...]  # ``from module import names``; empty for ``import module``
    line: int


def import_refs(name: str, source: str | None = None) -> list[ImportRef]:
    """Every import in module ``name`` (its file, or ``source`` given as its text): the one
    walker of import statements (the code deps here, the layer and view rules in tests)."""
    path = module_file(name)
    is_pkg = path is not None and path.name == "__init__.py"
    if source is None and path is None:
        raise ValueError(f"{name}: not a module of {PKG}")
    out: list[ImportRef] = []
    for node in ast.walk(_tree(name) if source is None else ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [ImportRef(a.name, (), node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = name.split(".")
                base = parts if is_pkg else parts[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append(ImportRef(mod, tuple(a.name for a in node.names), node.lineno))
    return out


@functools.cache
def imports(name: str) -> frozenset[str]:
    """Package modules that executing ``name`` can execute directly (see the module doc),
    with every parent package of each (importing ``a.b.c`` runs ``a`` and ``a.b``)."""
    path = module_file(name)
    if path is None:
        raise ValueError(f"{name}: not a module of {PKG}")
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for ref in import_refs(name):
        found.add(ref.module)
        found.update(f"{ref.module}.{n}" for n in ref.names)
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith(PKG + "."):
                found.add(node.value.split(":")[0])
        elif (
            is_pkg
            and isinstance(node, ast.Call)
            and ast.unparse(node.func).endswith("iter_modules")
            and "__path__" in ast.unparse(node)
        ):
            found.update(
                f"{name}.{p.stem}" for p in path.parent.glob("*.py") if p.stem != "__init__"
            )
    out: set[str] = set()
    for mod in found:
        parts = mod.split(".")
        if parts[0] != PKG:
            continue
        while parts and module_file(".".join(parts)) is None:
            parts.pop()
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return frozenset(out)


# Modules that only word text for people, and why no output can depend on them: they are
# no stage's code deps, so rewording a message or a help line reruns nothing. A test keeps
# them text-only (every function returns text, and they import only the schema).
TEXT_ONLY = {
    f"{PKG}.core.config.wording": "how a composition error reads: it stops a stage before "
    "the stage writes anything",
    f"{PKG}.core.config.help": "what --help and the key map say of a key: --help exits "
    "before the stage runs",
}


def executed_modules(stage: str) -> set[str]:
    """The import closure of ``eagle3_pipeline.stages.<stage>``, less :data:`TEXT_ONLY`."""
    seen: set[str] = set()
    todo = [f"{PKG}.stages.{stage}"]
    while todo:
        mod = todo.pop()
        if mod not in seen and mod not in TEXT_ONLY:
            seen.add(mod)
            todo.extend(imports(mod) - seen)
    return seen


def code_deps(stage: str) -> list[str]:
    """``stage``'s code deps as ``dvc.yaml`` lists them: repository-relative paths, a
    directory when every module under it is executed, sorted."""
    files = {module_file(m) for m in executed_modules(stage)}
    root = SRC.parent
    pkg_dir = SRC / PKG

    def whole(d: Path) -> bool:
        return all(p in files for p in d.rglob("*.py") if "__pycache__" not in p.parts)

    deps: list[str] = []

    def walk(d: Path) -> None:
        for child in sorted(d.iterdir()):
            if child.is_dir() and child.name != "__pycache__":
                if whole(child):
                    deps.append(child.relative_to(root).as_posix())
                else:
                    walk(child)
            elif child.suffix == ".py" and child in files:
                deps.append(child.relative_to(root).as_posix())

    walk(pkg_dir)
    return deps


def inputs_view(stage: str) -> Any:
    """The stage's input view class (``INPUTS`` of its entrypoint module), or None for a
    stage that declares none yet (its ``params:`` are left as they are)."""
    return getattr(importlib.import_module(f"{PKG}.stages.{stage}"), "INPUTS", None)


def params(stage: str, spec: dict[str, Any]) -> list[str] | None:
    """``stage``'s ``params:`` as its input view declares them: the view's keys, less
    its untracked ones and those its ``dvc.yaml`` entry templates (``${paths.draft}``),
    which DVC tracks through the template. None for a stage without a view."""
    view = inputs_view(stage)
    if view is None:
        return None
    rest = {k: v for k, v in spec.items() if k != "params"}
    templated = set(_TEMPLATE.findall(yaml.safe_dump(rest)))
    return [k for k in view.keys(tracked=True) if k not in templated]


def _entry_path(entry: str | dict[str, Any]) -> str:
    return entry if isinstance(entry, str) else next(iter(entry))


def cached_outputs(spec: dict[str, Any]) -> list[str]:
    """A stage's ``outs:`` that DVC caches, as ``dvc.yaml`` names them (``${paths.draft}``):
    not the ``cache: false`` figures, which never feed a stage."""
    out = []
    for entry in spec.get("outs", []):
        opts = entry[next(iter(entry))] if isinstance(entry, dict) else None
        if (opts or {}).get("cache", True) is not False:
            out.append(_entry_path(entry))
    return out


def dataflow_problems(graph: dict[str, Any]) -> list[str]:
    """What is wrong with the hand-written file deps of ``graph`` (``dvc.yaml``'s
    ``stages:``), one line each: a cached output no stage depends on that is not in
    :data:`END_PRODUCTS`; an :data:`END_PRODUCTS` entry that is no cached output or that a
    stage depends on; a stage whose input view reads another stage's cached output
    (``paths.K``) without depending on ``${paths.K}``."""
    deps = {name: {_entry_path(d) for d in spec.get("deps", [])} for name, spec in graph.items()}
    fed = set().union(*deps.values())
    writer = {out: name for name, spec in graph.items() for out in cached_outputs(spec)}
    problems = [
        f"stage {name} writes {out}, which no stage depends on: add it to the deps of the "
        f"stage it feeds, or to {__name__}.END_PRODUCTS with the reason nothing does"
        for out, name in writer.items()
        if out not in fed and out not in END_PRODUCTS
    ]
    problems += [
        f"{__name__}.END_PRODUCTS names {out}, which "
        + ("stage " + ", ".join(sorted(n for n in deps if out in deps[n])) + " depends on")
        * (out in fed)
        + "no stage writes as a cached output" * (out not in writer)
        for out in END_PRODUCTS
        if out in fed or out not in writer
    ]
    for name in graph:
        view = inputs_view(name) if name in STAGES else None
        for key in view.keys() if view is not None else []:
            out = "${" + key + "}"
            if writer.get(out, name) != name and out not in deps[name]:
                problems.append(
                    f"stage {name} reads {key} (its input view), stage {writer[out]}'s "
                    f"output, but does not depend on {out}"
                )
    return problems


def render(text: str) -> str:
    """``dvc.yaml``'s text with each stage's code deps replaced by :func:`code_deps` (the
    first entries of its ``deps:``; other deps and every comment kept) and, for a stage with
    an input view, its ``params:`` by :func:`params`: a YAML round trip (ruamel.yaml, which
    DVC itself reads and writes ``dvc.yaml`` with), so comments and order survive."""
    import io

    from ruamel.yaml import YAML

    graph = yaml.safe_load(text)["stages"]
    rt = YAML()
    rt.preserve_quotes = True
    rt.width = 4096  # never fold a long line
    rt.indent(mapping=2, sequence=4, offset=2)
    doc = rt.load(text)
    for name, stage in doc["stages"].items():
        if name not in STAGES:
            continue
        if stage.get("deps") is not None:
            _replace_leading(
                stage["deps"],
                lambda d: isinstance(d, str) and d.startswith(f"src/{PKG}"),
                code_deps(name),
            )
        keys = params(name, graph[name])
        if stage.get("params") is not None and keys is not None:
            _replace_leading(stage["params"], lambda p: isinstance(p, str), keys)
    out = io.StringIO()
    rt.dump(doc, out)
    return out.getvalue()


def _replace_leading(seq: Any, generated: Any, items: list[str]) -> None:
    """Drop the entries of ``seq`` (a round-trip sequence) that ``generated`` recognises and
    put ``items`` first; the comment after its last entry stays after the last entry."""
    tail = seq.ca.items.pop(len(seq) - 1, None) if len(seq) else None
    for i in reversed(range(len(seq))):
        if generated(seq[i]):
            del seq[i]
    for i, item in enumerate(items):
        seq.insert(i, item)
    if tail is not None and len(seq):
        seq.ca.items[len(seq) - 1] = tail


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="eagle3-graph",
        description="Rewrite dvc.yaml's code deps (each stage: the modules it imports) "
        "and params (each stage: the keys its input view declares), and the key map "
        "docs/configuration.md (every key's default, accepted values, description and "
        "readers, from the schema). Check its hand-written file deps: exit 1 when a "
        "cached output (a fingerprint, an artifact) feeds no stage and is no end product, "
        "or a stage reads another stage's output without depending on it.",
    )
    ap.add_argument("--dvc-yaml", default="dvc.yaml", type=Path)
    ap.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when dvc.yaml is stale"
    )
    args = ap.parse_args(argv)
    path: Path = args.dvc_yaml
    if not path.is_file():
        print(f"eagle3-graph: {path}: not found (run it in the repository root)", file=sys.stderr)
        return 2
    from eagle3_pipeline.tools import keymap

    text = path.read_text(encoding="utf-8")
    new = render(text)
    problems = dataflow_problems(yaml.safe_load(text)["stages"])
    for problem in problems:
        print(f"eagle3-graph: {path}: {problem}", file=sys.stderr)
    keys_path = path.parent / keymap.KEYMAP
    keys_old = keys_path.read_text(encoding="utf-8") if keys_path.is_file() else None
    keys_new = keymap.render()
    if args.check:
        stale = False
        if new != text:
            print(
                f"eagle3-graph: {path}: code deps differ from the import graph or params "
                "from the stage input views; run eagle3-graph to rewrite them",
                file=sys.stderr,
            )
            stale = True
        if keys_new != keys_old:
            print(
                f"eagle3-graph: {keys_path}: differs from the schema and the stage input "
                "views; run eagle3-graph to rewrite it",
                file=sys.stderr,
            )
            stale = True
        return 1 if stale or problems else 0
    for target, old, fresh, what in (
        (path, text, new, "code deps and params rewritten"),
        (keys_path, keys_old, keys_new, "key map rewritten"),
    ):
        if fresh != old:
            atomic_write_text(target, fresh)
            print(f"eagle3-graph: {target}: {what}")
        else:
            print(f"eagle3-graph: {target}: up to date")
    return 1 if problems else 0  # file deps are hand-written: reported, never rewritten


if __name__ == "__main__":
    sys.exit(main())
