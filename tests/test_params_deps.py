"""dvc.yaml's ``params:`` are derived from the code, the way its code deps are: each stage
lists exactly the config keys the functions it may run read (tests/config_reads.py: a
static analysis over the stage's import closure, the one tests/test_dvc_graph.py checks the
code deps against), and an edit of params.yaml stales exactly the stages that read the key.

How dvc.yaml lists a key: a section (``model``: DVC tracks every key under it) or a dotted
key (``train.epochs``). A section that may be null (``model.tiny``, ``model.gguf``) is
listed whole: a key under it would be missing from params.yaml whenever it is null. A key
templated into a stage's own entries (``${paths.draft}``) is tracked by DVC through the
templating and need not be listed."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from config_reads import (
    NOT_READS,
    SITES,
    Func,
    Index,
    Read,
    compare,
    declared_keys,
    stage_reads,
)
from stage_graph import (
    ROOT,
    STAGES,
    _dvc,
    _graph,
    executed_modules,
    make_locked_copy,
    templated_keys,
)

# Reads dvc.yaml need not list, by (key, file the read is in; "" any), each with why.
NOT_PARAMS = {
    (
        "metrics_dir",
        "src/eagle3_pipeline/core/metrics.py",
    ): "headline_path picks metrics_dir or paths.live by the record's HEADLINE_IN_DVCLIVE, "
    "a class constant the analysis does not evaluate: the stage's dvc.yaml templates "
    "the one it writes (${metrics_dir}/<stage>.json or ${paths.live}/<stage>/...)",
    ("paths.live", "src/eagle3_pipeline/core/metrics.py"): "the same (headline_path)",
    (
        "paths.cache",
        "",
    ): "content-keyed caches outside every output (file hashes remembered by stat, "
    "regenerated turns keyed by content): where they lie changes no result",
}


@pytest.fixture(scope="module")
def index() -> Index:
    return Index()


def derived(index: Index, stage: str) -> tuple[list[Read], list[str]]:
    """The reads of ``stage``'s code that dvc.yaml must cover, and what the analysis could
    not resolve."""
    reads, errors = stage_reads(index, executed_modules(stage), f"eagle3_pipeline.stages.{stage}")
    keep = [
        r
        for r in reads
        if not any(r.key == key and r.where.startswith(where) for key, where in NOT_PARAMS)
    ]
    return keep, errors


def problems(index: Index, graph: dict, stage: str) -> list[str]:
    reads, _ = derived(index, stage)
    return compare(
        stage, reads, declared_keys(graph[stage]), templated_keys(graph[stage]), index.schema
    )


def readers(index: Index, key: str) -> set[str]:
    """The stages whose code reads ``key`` (or consumes a section holding it)."""
    return {
        stage
        for stage in STAGES
        if any(
            r.key == key or (r.kind != "leaf" and key.startswith(r.key + "."))
            for r in derived(index, stage)[0]
        )
    }


def test_the_analysis_resolves_every_config_use(index: Index) -> None:
    """Every use of a config value in code the stages run is one the analysis follows;
    anything else fails here with its file:line instead of being guessed."""
    errors = sorted({e for stage in STAGES for e in derived(index, stage)[1]})
    assert not errors, "\n".join(errors)
    assert index.used_sites == set(SITES), (
        f"SITES entries no longer in the code: {sorted(set(SITES) - index.used_sites)}"
    )
    gone = [q for q in NOT_READS if not isinstance(index.lookup(q), Func)]
    assert not gone, f"NOT_READS entries no longer in the code: {gone}"


@pytest.mark.parametrize("stage", STAGES)
def test_params_are_the_keys_the_code_reads(index: Index, stage: str) -> None:
    found = problems(index, _graph(), stage)
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("stage", "key"),
    [
        ("train", "hardware.gpu_memory_mib"),  # DDP or FSDP under train.parallel=auto
        ("validate", "data.license"),  # the model card's
        ("extract", "seed"),  # the vLLM engine's
    ],
)
def test_a_param_missing_from_dvc_yaml_is_reported(index: Index, stage: str, key: str) -> None:
    """A real check: drop one key the code reads from a copy of dvc.yaml and the
    comparison names the stage and the key."""
    graph = copy.deepcopy(_graph())
    assert key in graph[stage]["params"]
    graph[stage]["params"].remove(key)
    found = problems(index, graph, stage)
    assert any(p.startswith(f"{stage}: reads {key} ") for p in found), found


def test_a_param_the_code_never_reads_is_reported(index: Index) -> None:
    graph = copy.deepcopy(_graph())
    graph["target"]["params"] += ["hardware.nodes", "data"]
    found = problems(index, graph, "target")
    assert "target: lists hardware.nodes, which its code never reads" in found, found
    assert "target: lists data, which its code never reads" in found, found
    graph["target"]["params"] += ["model.tiny.hidden_size"]  # under a nullable section
    assert any(
        "model.tiny.hidden_size, under model.tiny, which may be null" in p
        for p in problems(index, graph, "target")
    )


def test_keys_read_by_no_stage_are_known(index: Index) -> None:
    """Keys no stage reads, templates or consumes whole (a null test of a section reads
    none of its keys): each is a tool's, a label, or dead. A new one fails here, to be read,
    moved or removed."""
    graph = _graph()
    reads: list[Read] = []
    for stage in STAGES:
        reads += stage_reads(index, executed_modules(stage), f"eagle3_pipeline.stages.{stage}")[0]
    done = {r.key for r in reads if r.kind == "leaf"}
    done |= {t for stage in STAGES for t in templated_keys(graph[stage])}
    whole = {r.key for r in reads if r.kind == "whole"}
    unread = {
        k
        for k in index.schema.leaves("")
        if k not in done and not any(k.startswith(w + ".") for w in whole)
    }
    assert unread == {
        # eagle3-fetch's (the stages check the file's digest, data.pinned.sha256, and the
        # record's licence is data.license)
        "data.pinned.path",
        "data.pinned.member",
        "data.pinned.wheel_sha256",
        "data.pinned.license",
        "data.server.port",  # read through base_url's ${.port}
        "hardware.throughput.extract_tokens_per_s",  # eagle3-plan's estimates
        "hardware.throughput.train_conversations_per_s",
        "hardware.throughput.source",
        "model.gguf.member",  # eagle3-fetch's
        "model.gguf.wheel_sha256",
    }, sorted(unread)


# --------------------------------------------------------------------------- the analysis


PROBE = """
from dataclasses import asdict, replace
from operator import attrgetter

from eagle3_pipeline.core.config import Config, ServingConfig, TrainConfig

OPTIONS = ("fc_norm", "norm_output")


def epochs(t: TrainConfig) -> int:
    return t.epochs


def serving(cfg: Config) -> ServingConfig:
    return cfg.hardware.serving


class Holder:
    def __init__(self, cfg: Config) -> None:
        self.cfg, self.hw = cfg, cfg.hardware

    def go(self) -> int:
        return self.hw.serving.tensor_parallel_size + self.cfg.seed


def never_called(cfg: Config) -> None:
    print(cfg.target.lr)


def run(cfg: Config) -> None:
    t, hw = cfg.train, cfg.hardware
    print(t.lr, epochs(cfg.train), hw.name)
    print(getattr(cfg.preflight, "disk_path", None), [getattr(t.draft, o) for o in OPTIONS])
    print(attrgetter("data.heldout_size")(cfg))
    print(cfg.model.built_here, cfg.validate_runtime())
    print(asdict(cfg.vllm), serving(cfg).max_model_len, Holder(cfg).go())
    small = replace(cfg.extract, rank=0)
    print(small.world_size)
    if cfg.model.gguf is None:
        print("no gguf")


if __name__ == "__main__":
    run(Config())
"""


def _probe_index(tmp_path: Path, code: str) -> Index:
    """A package holding the real schema and one module, ``eagle3_pipeline.probe``."""
    src = tmp_path / "src"
    core = src / "eagle3_pipeline" / "core"
    core.mkdir(parents=True)
    (src / "eagle3_pipeline" / "__init__.py").write_text("")
    (core / "__init__.py").write_text("")
    shutil.copy(ROOT / "src/eagle3_pipeline/core/config.py", core / "config.py")
    (src / "eagle3_pipeline" / "probe.py").write_text(code)
    return Index(src)


def _probe(tmp_path: Path, code: str) -> tuple[dict[str, set[str]], list[str]]:
    index = _probe_index(tmp_path, code)
    reads, errors = stage_reads(index, {"eagle3_pipeline.probe"}, "eagle3_pipeline.probe")
    keys: dict[str, set[str]] = {}
    for r in reads:
        keys.setdefault(r.key, set()).add(r.kind)
    return keys, errors


def test_the_analysis_follows_the_documented_patterns(tmp_path: Path) -> None:
    keys, errors = _probe(tmp_path, PROBE)
    assert not errors, errors
    assert keys == {
        "train.lr": {"leaf"},
        "train.epochs": {"leaf"},
        "hardware.name": {"leaf"},
        "preflight.disk_path": {"leaf"},
        "train.draft.fc_norm": {"leaf"},
        "train.draft.norm_output": {"leaf"},
        "data.heldout_size": {"leaf"},
        # ModelConfig.built_here, and the is-None test
        "model.tiny": {"presence"},
        "model.gguf": {"presence"},
        # Config.validate_runtime
        "validate.device": {"leaf"},
        "hardware.device": {"leaf"},
        "validate.dtype": {"leaf"},
        "model.dtype": {"leaf"},
        "vllm": {"whole"},
        "hardware.serving.max_model_len": {"leaf"},
        "hardware.serving.tensor_parallel_size": {"leaf"},
        "seed": {"leaf"},
        "extract.world_size": {"leaf"},
    }  # never_called's target.lr is not among them


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (
            "import json\ndef run(cfg: Config):\n    json.dumps(cfg.train)\n",
            "passed to json.dumps, which the analysis cannot follow",
        ),
        (
            "def helper(t):\n    return t.lr\ndef run(cfg: Config):\n    helper(cfg.train)\n",
            "whose parameter is not annotated with its schema type",
        ),
        ("def train(cfg: Config):\n    return cfg.train\n", "without a schema return annotation"),
        (
            "def run(cfg: Config, name: str):\n    getattr(cfg.train, name)\n",
            "with a name the analysis cannot tell",
        ),
        (
            "from operator import attrgetter\ndef run(cfg: Config, k: str):\n"
            "    attrgetter(k)(cfg)\n",
            "attrgetter with keys that are not constants",
        ),
        ("def run(cfg: Config):\n    cfg.train.nonexistent\n", "has no field 'nonexistent'"),
        ("def run(s: ServerConfig):\n    s.port\n", "ServerConfig sits at"),
        (
            "def run(cfg: Config):\n    sections = [cfg.train, cfg.data]\n",
            "used in a way the analysis cannot follow",
        ),
        (
            "def run(cfg: Config, **kw):\n    print(*[1], **{'t': cfg.train})\n",
            "used in a way the analysis cannot follow",
        ),
    ],
)
def test_a_pattern_it_cannot_follow_fails_with_its_line(
    tmp_path: Path, code: str, message: str
) -> None:
    head = "from eagle3_pipeline.core.config import Config, ServerConfig\n"
    _, errors = _probe(tmp_path, head + code + "\nrun\n")
    assert any(message in e for e in errors), errors
    assert all(e.startswith("src/eagle3_pipeline/probe.py:") for e in errors), errors
    line = int(errors[0].split(":")[1])
    assert 2 <= line <= len(code.splitlines()) + 1  # the line of the pattern, not of the def


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
def test_params_edits_stale_exactly_the_stages_that_read_them(index: Index, tmp_path: Path) -> None:
    """Against a dvc.lock that records the current code and params: an edit of a key
    stales the stages the analysis says read it (and they rerun what they feed); an edit
    of a hardware profile that conf/config.yaml does not choose, recomposed, stales none."""
    t0 = time.monotonic()
    root = make_locked_copy(tmp_path / "repo")
    assert _changed_params(root) == {}
    params = root / "params.yaml"
    original = params.read_text(encoding="utf-8")

    key = "hardware.gpu_memory_mib"
    predicted = readers(index, key)
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
