"""The DVC graph cannot go stale: every module a stage executes is one of its deps, no
volatile file feeds a stage, and editing a module stales exactly the stages that run it."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from workdirs import repo_copy

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
STAGES = ("preflight", "target", "prepare", "extract", "train", "validate")


def _module_file(name: str) -> Path | None:
    p = SRC / name.replace(".", "/")
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").is_file() else None


def _imports(name: str) -> set[str]:
    """Package modules ``name`` imports, at any depth of its code (lazy imports included),
    plus modules named in strings (``python -m eagle3_pipeline.X`` workers, the vLLM
    connector's module path): a subprocess runs them for the stage too."""
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
    out: set[str] = set()
    for mod in found:
        parts = mod.split(".")
        if parts[0] != "eagle3_pipeline":
            continue
        while parts and _module_file(".".join(parts)) is None:
            parts.pop()
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


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


def _render(entry: str | dict, params: dict) -> str:
    """A dvc.yaml path entry with its ``${a.b}`` templates filled from params.yaml."""
    import re

    text = entry if isinstance(entry, str) else next(iter(entry))

    def value(m: re.Match[str]) -> str:
        node = params
        for key in m.group(1).split("."):
            node = node[key]
        return str(node)

    return re.sub(r"\$\{([\w.]+)\}", value, text)


@pytest.mark.parametrize("stage", STAGES)
def test_every_executed_module_is_a_dep(stage: str) -> None:
    deps = [_render(d, _params()) for d in _graph()[stage]["deps"]]
    missing = []
    for mod in sorted(executed_modules(stage)):
        rel = _module_file(mod).relative_to(ROOT).as_posix()
        if not any(rel == d or rel.startswith(d.rstrip("/") + "/") for d in deps):
            missing.append(rel)
    assert not missing, f"stage {stage} runs these modules but does not depend on them: {missing}"


def test_no_volatile_file_feeds_a_stage() -> None:
    params = _params()
    graph = _graph()
    volatile: set[str] = set()
    for spec in graph.values():
        for kind in ("metrics", "plots", "outs"):
            for entry in spec.get(kind, []):
                opts = entry[next(iter(entry))] if isinstance(entry, dict) else {}
                if kind != "outs" or (opts or {}).get("cache") is False:
                    volatile.add(_render(entry, params))
    for name, spec in graph.items():
        fed = {_render(d, params) for d in spec["deps"]} & volatile
        assert not fed, f"stage {name} depends on volatile files {sorted(fed)}"


def test_paths_in_the_graph_are_the_ones_stages_use() -> None:
    """dvc.yaml names artifacts only through params (``${paths.*}``), never literally."""
    text = (ROOT / "dvc.yaml").read_text(encoding="utf-8")
    entries = [ln.strip()[2:].split(":")[0] for ln in text.splitlines()
               if ln.strip().startswith("- ")]  # fmt: skip
    for literal in ("data/", "metrics/", "dvclive/", "plots/"):
        lines = [e for e in entries if e.startswith(literal)]
        assert not lines, f"dvc.yaml hard-codes {literal}: {lines}"
    # below ${paths.live}, dvclive's own layout (plots/metrics, plots/images) is fixed
    assert any(e.startswith("${paths.live}/train/plots/") for e in entries)


# --------------------------------------------------------------------------- dvc status


def _dvc(cwd: Path, *args: str) -> str:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"dvc {' '.join(args)}: {proc.stderr[-2000:]}"
    return proc.stdout


def _stale(cwd: Path) -> set[str]:
    import json

    status = json.loads(_dvc(cwd, "status", "--json"))
    return {name for name, changes in status.items()
            if any(isinstance(c, dict) and "changed deps" in c for c in changes)}


@pytest.fixture(scope="module")
def locked_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the repository's tracked files whose dvc.lock records the current code,
    with placeholder outputs (only dependencies are under test here)."""
    root = repo_copy(tmp_path_factory.mktemp("repo"))
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


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        # the target adapter: every stage runs it
        ("targets/adapter.py", {"preflight", "target", "prepare", "extract", "train", "validate"}),
        # the validator: only validate
        ("validate/checkpoint.py", {"validate"}),
        # the trainer: only train
        ("train/__init__.py", {"train"}),
    ],
)
def test_editing_a_module_stales_the_stages_that_run_it(
    locked_copy: Path, module: str, expected: set[str]
) -> None:
    path = locked_copy / "src" / "eagle3_pipeline" / module
    original = path.read_text(encoding="utf-8")
    try:
        path.write_text(original + "\n# edited by a test\n", encoding="utf-8")
        assert _stale(locked_copy) - {"preflight"} == expected - {"preflight"}
    finally:
        path.write_text(original, encoding="utf-8")
    assert _stale(locked_copy) <= {"preflight"}


# --------------------------------------------------------------------------- local target


def _repro(cwd: Path, stage: str) -> str:
    out = _dvc(cwd, "repro", stage)
    ran = f"Running stage '{stage}'" in out
    assert ran or f"Stage '{stage}' didn't change" in out, out[-2000:]
    return "ran" if ran else "skipped"


def test_a_local_target_changed_in_place_reruns_the_graph(
    tiny_target: Path, tmp_path: Path
) -> None:
    """With ``model.path`` the checkpoint lives outside the repo. Preflight fingerprints it
    (small files by content, shards by size and mtime) into a file the target stage depends
    on: an unchanged checkpoint reruns nothing, a changed shard or tokenizer reruns target.
    A local data file is fingerprinted the same way (by content) for prepare."""
    import json

    local = tmp_path / "checkpoint"
    shutil.copytree(tiny_target / "data/target/model", local)
    repo = repo_copy(tmp_path / "repo")
    subprocess.run([sys.executable, "-m", "eagle3_pipeline.core.compose", "model.tiny=null",
                    f"model.path={local}", "validate.vllm=false"], cwd=repo, check=True,
                   capture_output=True)
    assert _repro(repo, "target") == "ran"
    fp = json.loads((repo / "data/preflight/target_fingerprint.json").read_text())
    assert fp["mode"] == "stat" and "sha256" in fp["files"]["config.json"]
    assert set(fp["files"]["model-00001-of-00006.safetensors"]) == {"size", "mtime_ns"}
    assert _repro(repo, "target") == "skipped"

    with open(local / "model-00006-of-00006.safetensors", "ab") as fh:  # weights changed in place
        fh.write(b"\0" * 8)
    assert _repro(repo, "target") == "ran"
    assert _repro(repo, "target") == "skipped"

    tok = local / "tokenizer_config.json"
    tok.write_text(tok.read_text() + "\n")  # same size class, new content
    assert _repro(repo, "target") == "ran"

    # a local data file, edited in place (same size, new content), reruns prepare
    line = {"messages": [{"role": "user", "content": "What is a list?"},
                         {"role": "assistant", "content": "An ordered sequence."}]}
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for _ in range(4)))
    subprocess.run([sys.executable, "-m", "eagle3_pipeline.core.compose", "model.tiny=null",
                    f"model.path={local}", "validate.vllm=false", "data.source=file",
                    f"data.path={data}", "data.regenerate=false", "data.heldout_size=1",
                    "train.samples=3"], cwd=repo, check=True, capture_output=True)
    assert _repro(repo, "prepare") == "ran"
    assert _repro(repo, "prepare") == "skipped"
    data.write_text(data.read_text().replace("list", "LIST"))
    assert _repro(repo, "prepare") == "ran"
    fp = json.loads((repo / "data/preflight/data_fingerprint.json").read_text())
    assert fp["size"] == data.stat().st_size and len(fp["sha256"]) == 64
