"""The library's subpackages are layered, and no import goes up the layers or round a cycle.

Every import of every module under ``src/eagle3_pipeline`` counts, at any depth of its
code: module level, inside functions (a lazy import is still a dependency, only a hidden
one) and under ``if TYPE_CHECKING:`` (an annotation naming a class of an upper layer ties
the two modules together just the same; none is exempt). Found by parsing (AST), nothing is
imported. Importing a submodule also runs its parent packages' ``__init__``; that implicit
edge is not counted (it would make every package a cycle), an explicit
``from eagle3_pipeline.x import name`` of the ``__init__`` is.

The order is stated once for people, in docs/architecture.md ("Subpackages": its table,
lowest first), and once here, :data:`LAYERS`; a test keeps the two equal.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from eagle3_pipeline.tools.graph import import_refs

ROOT = Path(__file__).resolve().parents[2]
PKG = "eagle3_pipeline"
SRC = ROOT / "src" / PKG
DOC = ROOT / "docs" / "architecture.md"

# Lowest first: a subpackage may import only itself and the ones before it.
LAYERS = (
    "core",
    "runtime",
    "compat",
    "serving",
    "targets",
    "data",
    "draft",
    "extract",
    "train",
    "validate",
    "plan",
    "preflight",
    "stages",
    "tools",
)

# Run inside the separate vLLM environment, where this package is installed without its
# dependencies: the standard library, what that environment has, the counters (and the
# formulas they use) and our plugin.
VLLM_ENV_MODULES = {
    f"{PKG}.serving.worker": {f"{PKG}.serving.counters", f"{PKG}.compat.vllm_expand"},
    f"{PKG}.serving.connector": {f"{PKG}.serving.counters"},
    f"{PKG}.serving.counters": {f"{PKG}.serving.figures"},
    f"{PKG}.serving.figures": set(),
    # a vLLM plugin (entry point in pyproject.toml): loaded by every vLLM process
    f"{PKG}.compat.vllm_expand": set(),
}
VLLM_ENV_PACKAGES = {"vllm", "torch", "safetensors"}


@dataclass(frozen=True)
class Edge:
    source: str  # the importing module
    target: str  # the imported module (a package's __init__ by the package's name)
    path: Path
    line: int

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT).as_posix()}:{self.line}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _resolve(name: str) -> str:
    """The longest prefix of ``name`` that is a module of the package."""
    parts = name.split(".")
    while parts and ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts)


def _imports(module: str, source: str | None = None) -> list[tuple[str, int]]:
    """``(imported name, line)`` for every import in ``module`` (its file, or ``source``),
    at any depth of its code, relative ones made absolute (the package's one walker)."""
    out: list[tuple[str, int]] = []
    for ref in import_refs(module, source):
        if not ref.names:
            out.append((ref.module, ref.line))
        # ``from pkg import sub``: the submodule when there is one, else pkg itself
        out += [
            (f"{ref.module}.{n}" if f"{ref.module}.{n}" in MODULES else ref.module, ref.line)
            for n in ref.names
        ]
    return out


def package_edges() -> list[Edge]:
    edges = []
    for module, path in MODULES.items():
        for name, line in _imports(module):
            if name == PKG or name.startswith(PKG + "."):
                target = _resolve(name)
                if target and target != module:
                    edges.append(Edge(module, target, path, line))
    return edges


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None  # None: the top-level package itself


def upward_edges(edges: list[Edge]) -> list[str]:
    rank = {name: i for i, name in enumerate(LAYERS)}
    bad = []
    for e in edges:
        src, dst = _layer(e.source), _layer(e.target)
        if src is None or dst is None or src == dst:
            continue
        if rank[dst] > rank[src]:
            bad.append(f"{e.where}: {e.source} imports {e.target} ({src}/ is below {dst}/)")
    return bad


def cycles_within_subpackages(edges: list[Edge]) -> list[str]:
    """Every strongly connected group of two or more modules of one subpackage, with the
    imports that tie it (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for e in edges:
        if _layer(e.source) is not None and _layer(e.source) == _layer(e.target):
            graph[e.source].add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    out = []
    for group in groups:
        ties = sorted(
            {
                f"{e.where} ({e.source} -> {e.target})"
                for e in edges
                if e.source in group and e.target in group
            }
        )
        out.append(f"cycle {sorted(group)}: " + "; ".join(ties))
    return out


def documented_order() -> list[str]:
    """The subpackages of docs/architecture.md's "Subpackages" table, in order."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n## Subpackages", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([a-z_]+)/` \|", section, flags=re.MULTILINE)


# --------------------------------------------------------------------------- the rule


def test_layers_name_every_subpackage_once() -> None:
    on_disk = sorted(p.parent.name for p in SRC.glob("*/__init__.py"))
    assert sorted(LAYERS) == on_disk, "add the new subpackage to LAYERS (and the docs' table)"


def test_the_documented_order_is_the_enforced_one() -> None:
    assert documented_order() == list(LAYERS), (
        f"{DOC.relative_to(ROOT)}: the Subpackages table must list {list(LAYERS)} in this order"
    )


def test_no_import_goes_up_the_layers() -> None:
    bad = upward_edges(package_edges())
    assert not bad, (
        "imports of an upper layer (lowest first: " + " < ".join(LAYERS) + "):\n" + "\n".join(bad)
    )


def test_no_import_cycle_within_a_subpackage() -> None:
    bad = cycles_within_subpackages(package_edges())
    assert not bad, "import cycles between modules:\n" + "\n".join(bad)


def test_the_top_level_package_imports_no_subpackage() -> None:
    assert [e.where for e in package_edges() if e.source == PKG] == []


@pytest.mark.parametrize("module", sorted(VLLM_ENV_MODULES))
def test_modules_run_in_the_vllm_environment_import_only_what_it_has(module: str) -> None:
    """The vLLM worker and connector run where this package's dependencies are not
    installed: the standard library, vLLM (and its torch, safetensors) and the counters."""
    allowed = VLLM_ENV_MODULES[module]
    bad = []
    for name, line in _imports(module):
        top = name.split(".")[0]
        if top == PKG:
            if _resolve(name) not in allowed:
                bad.append(f"{MODULES[module].name}:{line}: {name}")
        elif top not in sys.stdlib_module_names and top not in VLLM_ENV_PACKAGES:
            bad.append(f"{MODULES[module].name}:{line}: {name}")
    assert not bad, f"{module} runs inside the vLLM environment; it imports {bad}"


# --------------------------------------------------------------------------- the checker


def test_the_parser_finds_lazy_type_checking_and_relative_imports() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import fingerprint\n"
        "from ..core.io import atomic_write_json\n"
        "if TYPE_CHECKING:\n"
        "    from eagle3_pipeline.train.loop import DraftTrainer\n"
        "def f():\n"
        "    import eagle3_pipeline.validate.report\n"
        "    from eagle3_pipeline.plan import resources\n"
    )
    found = [
        (n, line) for n, line in _imports(f"{PKG}.targets.resolve", source) if n.startswith(PKG)
    ]
    assert found == [
        (f"{PKG}.targets.fingerprint", 2),
        (f"{PKG}.core.io", 3),
        (f"{PKG}.train.loop", 5),
        (f"{PKG}.validate.report", 7),
        (f"{PKG}.plan.resources", 8),
    ]


def test_an_upward_lazy_import_and_a_cycle_are_reported() -> None:
    fake = [
        Edge(f"{PKG}.core.config", f"{PKG}.targets.families", SRC / "core/config.py", 518),
        Edge(f"{PKG}.train.loop", f"{PKG}.train.state", SRC / "train/loop.py", 47),
        Edge(f"{PKG}.train.state", f"{PKG}.train.loop", SRC / "train/state.py", 28),
    ]
    up = upward_edges(fake)
    assert up == [
        f"src/{PKG}/core/config.py:518: {PKG}.core.config imports "
        f"{PKG}.targets.families (core/ is below targets/)"
    ]
    (cycle,) = cycles_within_subpackages(fake)
    assert "src/eagle3_pipeline/train/state.py:28" in cycle and "train/loop.py:47" in cycle
