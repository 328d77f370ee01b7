"""The DVC graph cannot go stale: every module a stage executes is one of its deps, no
volatile file feeds a stage, and editing a module stales exactly the stages that run it."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from commands import run_ok
from stage_graph import (
    ROOT,
    STAGES,
    _dvc,
    _graph,
    _module_file,
    _params,
    _render,
    _stale,
    executed_modules,
    make_locked_copy,
)
from workdirs import repo_copy

from eagle3_pipeline.tools.graph import (
    END_PRODUCTS,
    TEXT_ONLY,
    dataflow_problems,
    import_refs,
    module_file,
    render,
)
from eagle3_pipeline.tools.keymap import KEYMAP
from eagle3_pipeline.tools.keymap import render as render_keymap


@pytest.mark.parametrize("stage", STAGES)
def test_every_executed_module_is_a_dep(stage: str) -> None:
    deps = [_render(d, _params()) for d in _graph()[stage]["deps"]]
    missing = []
    for mod in sorted(executed_modules(stage)):
        path = _module_file(mod)
        assert path is not None, mod
        rel = path.relative_to(ROOT).as_posix()
        if not any(rel == d or rel.startswith(d.rstrip("/") + "/") for d in deps):
            missing.append(rel)
    assert not missing, f"stage {stage} runs these modules but does not depend on them: {missing}"


# what a fresh interpreter has loaded after importing a stage's entrypoint: the package
# modules' files, one per line (found by Python itself, not by the generator's walker)
_LOADED = (
    "import importlib, sys; importlib.import_module(sys.argv[1]); "
    "print('\\n'.join(sorted(m.__file__ for n, m in list(sys.modules.items()) "
    "if n.split('.')[0] == 'eagle3_pipeline' and getattr(m, '__file__', None))))"
)


def _uncovered(files: list[Path], deps: list[str]) -> list[str]:
    """The files (under ROOT) that no dep names, by itself or by a directory above it."""
    rels = [f.resolve().relative_to(ROOT).as_posix() for f in files]
    return [r for r in rels if not any(r == d or r.startswith(d.rstrip("/") + "/") for d in deps)]


@pytest.mark.parametrize("stage", STAGES)
def test_what_python_loads_for_a_stage_is_among_its_deps(stage: str) -> None:
    """The check independent of ``eagle3-graph``'s own import walker: import the stage's
    entrypoint in a fresh interpreter and every package module Python has loaded must be a
    generated dep (the walker also sees lazy imports, so the deps may hold more)."""
    out = subprocess.run(
        [sys.executable, "-c", _LOADED, f"eagle3_pipeline.stages.{stage}"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    text_only = {module_file(m) for m in TEXT_ONLY}
    loaded = [Path(line) for line in out.splitlines() if line.strip()]
    loaded = [p for p in loaded if p.resolve() not in text_only]
    assert any(p.name == f"{stage}.py" for p in loaded), out[-2000:]
    deps = [_render(d, _params()) for d in _graph()[stage]["deps"]]
    missing = _uncovered(loaded, deps)
    assert not missing, f"stage {stage} loads these modules but does not depend on them: {missing}"


@pytest.mark.parametrize("module", sorted(TEXT_ONLY))
def test_a_text_only_module_only_words_text(module: str) -> None:
    """What makes a module's edits unable to change an output: every public function in it
    returns text (a string, strings, or a record of strings), and it imports nothing of the
    package but the schema it describes."""
    import dataclasses
    import inspect
    import typing

    mod = importlib.import_module(module)
    texts = {str, str | None, list[str]}
    for name, fn in inspect.getmembers(mod, inspect.isfunction):
        if fn.__module__ != module or name.startswith("_"):
            continue  # imported, or a private helper of the text
        ret = typing.get_type_hints(fn)["return"]
        record = dataclasses.is_dataclass(ret) and all(
            t is str for t in typing.get_type_hints(ret).values()
        )
        assert ret in texts or record, f"{module}.{name} returns {ret}, not text"
    ours = {r.module for r in import_refs(module) if r.module.startswith("eagle3_pipeline")}
    assert ours <= {"eagle3_pipeline.core.config.schema"}, ours


def test_the_loaded_modules_check_can_fail() -> None:
    """A dep removed (a file, or the directory that covers it) is what the check reports."""
    src = ROOT / "src" / "eagle3_pipeline"
    files = [src / "core" / "io.py", src / "draft" / "layers.py"]
    deps = ["src/eagle3_pipeline/core/io.py", "src/eagle3_pipeline/draft"]
    assert _uncovered(files, deps) == []
    assert _uncovered(files, deps[1:]) == ["src/eagle3_pipeline/core/io.py"]
    assert _uncovered(files, deps[:1]) == ["src/eagle3_pipeline/draft/layers.py"]


@pytest.mark.parametrize("stage", STAGES)
def test_no_code_dep_is_a_module_the_stage_never_runs(stage: str) -> None:
    executed = {_module_file(m) for m in executed_modules(stage)}
    extra = []
    for d in _graph()[stage]["deps"]:
        path = ROOT / _render(d, _params())
        if not path.as_posix().startswith((ROOT / "src").as_posix()):
            continue
        files = [path] if path.is_file() else sorted(path.rglob("*.py"))
        extra += [f.relative_to(ROOT).as_posix() for f in files if f not in executed]
    assert not extra, f"stage {stage} depends on modules it never runs: {extra}"


def test_code_deps_and_params_are_what_eagle3_graph_generates() -> None:
    text = (ROOT / "dvc.yaml").read_text(encoding="utf-8")
    assert render(text) == text, "dvc.yaml's code deps or params are stale: run eagle3-graph"
    proc = subprocess.run(
        [sys.executable, "-m", "eagle3_pipeline.tools.graph", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        # a module a stage runs, dropped from its deps
        (
            lambda t: t.replace("      - src/eagle3_pipeline/core/config/schema.py\n", "", 1),
            "missing",
        ),
        # a tool added to a stage's deps
        (
            lambda t: t.replace(
                "    deps:\n", "    deps:\n      - src/eagle3_pipeline/tools/fetch\n", 1
            ),
            "extra",
        ),
        # a key preflight's view declares, dropped from its params (the first stage listed)
        (lambda t: t.replace("      - hardware.gpu_memory_mib\n", "", 1), "param missing"),
        # a key preflight's view does not list as such, added to its params
        (
            lambda t: t.replace("    params:\n", "    params:\n      - data.name\n", 1),
            "param extra",
        ),
    ],
)
def test_eagle3_graph_check_fails_on_a_stale_dvc_yaml(tmp_path: Path, edit, why: str) -> None:
    text = (ROOT / "dvc.yaml").read_text(encoding="utf-8")
    stale = edit(text)
    assert stale != text, why
    assert render(stale) == text  # regenerating repairs it
    (tmp_path / "dvc.yaml").write_text(stale, encoding="utf-8")
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / KEYMAP, tmp_path / KEYMAP)  # current: only dvc.yaml is stale
    proc = subprocess.run(
        [sys.executable, "-m", "eagle3_pipeline.tools.graph", "--check"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "dvc.yaml" in proc.stderr and str(KEYMAP) not in proc.stderr


def test_the_key_map_is_generated_from_the_schema_and_checked(tmp_path: Path) -> None:
    """docs/configuration.md is what the schema and the views say; a stale one fails the
    check, and eagle3-graph rewrites it."""
    from eagle3_pipeline.core.config.help import key_facts, leaf_keys

    text = (ROOT / KEYMAP).read_text(encoding="utf-8")
    assert text == render_keymap(), "docs/configuration.md is stale: run eagle3-graph"
    keys = leaf_keys()
    assert len(keys) > 150 and all(f"| `{k}` |" in text for k in keys)
    undocumented = [k for k in keys if not key_facts(k).doc]
    assert not undocumented, f"keys without a description: {undocumented}"
    assert "| `train.epochs` | `20` | int >= 1 | train | passes over the training rows |" in text
    assert "| `vllm.extra_args` | `[]` | list[str] |" in text
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    (tmp_path / "docs").mkdir()
    (tmp_path / KEYMAP).write_text(text.replace("passes over", "loops over"), encoding="utf-8")
    cmd = [sys.executable, "-m", "eagle3_pipeline.tools.graph"]
    proc = subprocess.run([*cmd, "--check"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 1 and str(KEYMAP) in proc.stderr
    assert subprocess.run(cmd, cwd=tmp_path, capture_output=True).returncode == 0
    assert (tmp_path / KEYMAP).read_text(encoding="utf-8") == text


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_help_lists_the_keys_it_reads(stage: str) -> None:
    """--help names every key the stage's view reads, with its default and description."""
    from eagle3_pipeline.core.config.help import key_facts, leaf_keys

    view = importlib.import_module(f"eagle3_pipeline.stages.{stage}").INPUTS
    proc = subprocess.run(
        [sys.executable, "-m", f"eagle3_pipeline.stages.{stage}", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    for key in [leaf for k in view.keys() for leaf in leaf_keys(k)]:
        facts = key_facts(key)
        assert f"  {key} = {facts.default}  [" in proc.stdout and facts.doc in proc.stdout, key


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


def test_every_cached_output_feeds_a_stage_or_is_an_end_product() -> None:
    """A stage's cached output (a fingerprint, an artifact) is some stage's dep, unless it
    is one of the named end products; the volatile figures (``cache: false``) are never
    deps (the test above). A fingerprint no stage depends on is an edit that reruns
    nothing: preflight wrote ``paths.init_fingerprint`` and train did not depend on it,
    so a warm-start source edited in place left the old draft cached."""
    params = _params()
    graph = _graph()
    deps = {_render(d, params) for spec in graph.values() for d in spec["deps"]}
    products = {_render(p, params) for p in END_PRODUCTS}
    unfed = []
    for name, spec in graph.items():
        for entry in spec.get("outs", []):
            opts = entry[next(iter(entry))] if isinstance(entry, dict) else None
            out = _render(entry, params)
            if (opts or {}).get("cache", True) is not False and out not in deps | products:
                unfed.append(f"{name}: {out}")
    assert not unfed, f"cached outputs no stage depends on: {unfed}"
    # every fingerprint preflight writes stands for some stage's input
    fingerprints = [k for k in params["paths"] if "fingerprint" in k]
    assert {"target_fingerprint", "data_fingerprint", "init_fingerprint"} <= set(fingerprints)
    for key in fingerprints:
        assert "${paths." + key + "}" in [o for o in graph["preflight"]["outs"]], key
        assert params["paths"][key] in deps, f"paths.{key}: written, never a dependency"
    assert "${paths.init_fingerprint}" in graph["train"]["deps"]
    # an end product is one indeed: written by a stage, read by none
    assert not products & deps, sorted(products & deps)
    assert dataflow_problems(graph) == []


def _drop_dep(text: str, stage: str, dep: str) -> str:
    """``text`` (dvc.yaml) without the dep ``dep`` of ``stage``."""
    lines = text.splitlines(keepends=True)
    start = lines.index(f"  {stage}:\n")
    i = next(i for i in range(start, len(lines)) if lines[i] == f"      - {dep}\n")
    return "".join(lines[:i] + lines[i + 1 :])


@pytest.mark.parametrize(
    ("stage", "dep", "message"),
    [
        # the omission of issue 47: the warm-start source's fingerprint feeds no stage
        (
            "train",
            "${paths.init_fingerprint}",
            "stage preflight writes ${paths.init_fingerprint}, which no stage depends on",
        ),
        # an artifact a stage reads (its view's paths.prepared) that another stage still
        # depends on: the view says extract reads it
        (
            "extract",
            "${paths.prepared}",
            "stage extract reads paths.prepared (its input view), stage prepare's output, "
            "but does not depend on ${paths.prepared}",
        ),
    ],
)
def test_eagle3_graph_check_fails_on_a_lost_file_dep(
    tmp_path: Path, stage: str, dep: str, message: str
) -> None:
    """File deps are written by hand (a fingerprint stands for content the stage reads by
    another name): ``eagle3-graph`` cannot regenerate them, so it checks them, and says
    which is missing; it still exits 1 after rewriting what it can."""
    text = (ROOT / "dvc.yaml").read_text(encoding="utf-8")
    lost = _drop_dep(text, stage, dep)
    assert yaml.safe_load(lost)["stages"][stage]["deps"] == [
        d for d in _graph()[stage]["deps"] if d != dep
    ]
    (tmp_path / "dvc.yaml").write_text(lost, encoding="utf-8")
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / KEYMAP, tmp_path / KEYMAP)
    cmd = [sys.executable, "-m", "eagle3_pipeline.tools.graph"]
    for args in (["--check"], []):
        proc = subprocess.run([*cmd, *args], cwd=tmp_path, capture_output=True, text=True)
        assert proc.returncode == 1 and message in proc.stderr, (args, proc.stderr)
    written = yaml.safe_load((tmp_path / "dvc.yaml").read_text(encoding="utf-8"))
    assert dep not in written["stages"][stage]["deps"]  # reported, never invented


def test_paths_in_the_graph_are_the_ones_stages_use() -> None:
    """dvc.yaml names artifacts only through params (``${paths.*}``), never literally."""
    text = (ROOT / "dvc.yaml").read_text(encoding="utf-8")
    entries = [
        ln.strip()[2:].split(":")[0] for ln in text.splitlines() if ln.strip().startswith("- ")
    ]
    for literal in ("data/", "metrics/", "dvclive/", "plots/"):
        lines = [e for e in entries if e.startswith(literal)]
        assert not lines, f"dvc.yaml hard-codes {literal}: {lines}"
    # below ${paths.live}, dvclive's own layout (plots/metrics, plots/images) is fixed
    assert any(e.startswith("${paths.live}/train/plots/") for e in entries)


# --------------------------------------------------------------------------- dvc status


@pytest.fixture(scope="module")
def locked_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the repository's tracked files whose dvc.lock records the current code,
    with placeholder outputs (only dependencies are under test here)."""
    return make_locked_copy(tmp_path_factory.mktemp("repo"))


@pytest.mark.integration
@pytest.mark.parametrize(
    ("module", "expected"),
    [
        # the target adapter: every stage runs it
        ("targets/adapter.py", {"preflight", "target", "prepare", "extract", "train", "validate"}),
        # the validator: only validate
        ("validate/checkpoint/validator.py", {"validate"}),
        # the trainer: only train
        ("train/__init__.py", {"train"}),
        # tools: no stage
        ("tools/fetch/cli.py", set()),
        ("tools/compose.py", set()),
        # the schema: every stage reads the config through it
        (
            "core/config/schema.py",
            {"preflight", "target", "prepare", "extract", "train", "validate"},
        ),
        # text for people only (graph.TEXT_ONLY): a reworded error or help line
        ("core/config/wording.py", set()),
        ("core/config/help.py", set()),
        ("compat/dvc_remote.py", set()),
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


@pytest.mark.integration
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
    subprocess.run(
        [
            sys.executable,
            "-m",
            "eagle3_pipeline.tools.compose",
            "model.tiny=null",
            f"model.path={local}",
            "validate.vllm=false",
        ],
        cwd=repo,
        check=True,
        capture_output=True,
    )
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
    line = {
        "messages": [
            {"role": "user", "content": "What is a list?"},
            {"role": "assistant", "content": "An ordered sequence."},
        ]
    }
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for _ in range(4)))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "eagle3_pipeline.tools.compose",
            "model.tiny=null",
            f"model.path={local}",
            "validate.vllm=false",
            "data.source=file",
            f"data.path={data}",
            "data.regenerate=false",
            "data.heldout_size=1",
            "train.samples=3",
        ],
        cwd=repo,
        check=True,
        capture_output=True,
    )
    assert _repro(repo, "prepare") == "ran"
    assert _repro(repo, "prepare") == "skipped"
    data.write_text(data.read_text().replace("list", "LIST"))
    assert _repro(repo, "prepare") == "ran"
    fp = json.loads((repo / "data/preflight/data_fingerprint.json").read_text())
    assert fp["size"] == data.stat().st_size and len(fp["sha256"]) == 64


# the smallest graph that trains and validates: a 30-step tiny target, 4 recorded
# conversations, 2 optimizer steps, our evaluator alone on 1 held-out prompt x 8 tokens
_TINY_GRAPH = (
    "target.train_steps=30",
    "data.regenerate=false",
    "data.heldout_size=1",
    "train.samples=4",
    "train.epochs=1",
    "train.max_steps=2",
    "validate.vllm=false",
    "validate.max_new_tokens=8",
    "validate.temperature=null",
)


def _ran(out: str) -> set[str]:
    """The stages a ``dvc repro`` output says it ran (the others it names it skipped)."""
    ran = set(re.findall(r"Running stage '(\w+)'", out))
    skipped = set(re.findall(r"Stage '(\w+)' didn't change", out))
    assert not ran & skipped, out[-2000:]
    return ran


@pytest.mark.integration
def test_a_warm_start_source_edited_in_place_reruns_train(tmp_path: Path) -> None:
    """``train.init_from`` names a draft outside the repository, by a path that does not
    change when the draft does. Preflight writes its content digest to
    ``paths.init_fingerprint``, a dep of train: a source edited in place stales train and
    nothing else once preflight has read it, and ``dvc repro`` (preflight first: it always
    runs) retrains from the new weights, then validates the new draft; target, prepare and
    extract stay cached. Before preflight reruns, ``dvc status`` cannot see the edit."""
    import json

    from safetensors.torch import load_file, save_file

    repo = repo_copy(tmp_path / "repo", commit=True)  # dvclive reads the git revision

    def compose(*overrides: str) -> None:
        run_ok(repo, sys.executable, "-m", "eagle3_pipeline.tools.compose", *overrides)

    def draft_hash() -> str:
        lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["train"]
        return next(o["md5"] for o in lock["outs"] if o["path"] == _params()["paths"]["draft"])

    def digest() -> str:
        return json.loads((repo / "data/preflight/init_fingerprint.json").read_text())["sha256"]

    # a first draft, copied out: the warm start's source
    compose(*_TINY_GRAPH)
    assert _ran(_dvc(repo, "repro", "train")) == set(STAGES) - {"validate"}
    source = tmp_path / "source"
    shutil.copytree(repo / "data/draft", source)
    compose(*_TINY_GRAPH, f"train.init_from={source}")
    assert _ran(_dvc(repo, "repro")) == {"preflight", "train", "validate"}
    assert _stale(repo) == set()
    before, old_digest = draft_hash(), digest()

    # the source's weights change in place: same path, same params
    weights = source / "model.safetensors"
    tensors = load_file(weights)
    save_file(
        {k: t * 0.5 if t.is_floating_point() else t for k, t in tensors.items()},
        weights,
        metadata={"format": "pt"},
    )
    assert _stale(repo) == set()  # the digest is preflight's reading: none yet
    assert _ran(_dvc(repo, "repro", "preflight")) == {"preflight"}
    assert digest() != old_digest
    assert _stale(repo) == {"train"}  # not target, prepare or extract; validate follows

    out = _dvc(repo, "repro")
    assert _ran(out) == {"preflight", "train", "validate"}, out[-2000:]
    assert draft_hash() != before
    trained = json.loads((repo / "metrics/details/train.json").read_text())
    assert trained["init_from"]["sha256"] == digest()
    assert _stale(repo) == set()


def test_the_draft_is_a_model_artifact() -> None:
    """``dvc.yaml``'s ``artifacts:`` names the draft (type model), at train's output path."""
    from dvc.repo import Repo

    artifacts = Repo(str(ROOT)).artifacts.read()["dvc.yaml"]
    draft = artifacts["eagle3-draft"]
    assert draft.type == "model"
    assert draft.path == _params()["paths"]["draft"]
    assert {"path": "${paths.draft}"}.items() <= _graph_artifacts()["eagle3-draft"].items()


def _graph_artifacts() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["artifacts"]


def test_the_committed_lock_records_the_graph_as_declared() -> None:
    """``dvc.lock`` is committed so a clone knows what produced the figures: each stage's
    locked deps and params must be exactly those ``dvc.yaml`` declares (a lock left behind
    by a refactor lists modules that no longer exist). Refresh it with ``dvc repro``."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())

    def resolve(path: str) -> str:
        def value(m: re.Match[str]) -> str:
            node = params
            for part in m.group(1).split("."):
                node = node[part]
            return str(node)

        return re.sub(r"\$\{([^}]+)\}", value, path)

    graph = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    lock = yaml.safe_load((ROOT / "dvc.lock").read_text())["stages"]
    assert set(lock) == set(graph)
    for stage, spec in graph.items():
        declared = {resolve(d) for d in spec.get("deps", [])}
        locked = {d["path"] for d in lock[stage].get("deps", [])}
        assert locked == declared, (
            f"{stage}: lock-only {locked - declared}, yaml-only {declared - locked}"
        )
        keys = {
            k
            for entry in spec.get("params", [])
            for k in ([entry] if isinstance(entry, str) else entry)
        }
        assert set(lock[stage].get("params", {}).get("params.yaml", {})) == keys, stage
