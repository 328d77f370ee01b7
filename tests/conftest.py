"""Shared fixtures and the test tiers. Expensive things (the tiny targets) are built once
per session.

Tiers (README): ``quick`` -- config, graph, validators, plan and data logic; no model is
built or trained and no DVC command runs (enforced below: a quick test that starts ``dvc``,
builds a ``PreTrainedModel`` or runs a backward pass fails). ``integration`` -- builds tiny targets, trains a few steps, runs DVC commands.
``slow`` -- end to end: whole DVC graphs, real vLLM, the real model. A test is marked
``integration`` or ``slow`` explicitly (or ``integration`` by using a fixture in
:data:`MODEL_FIXTURES`); every other test is ``quick``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"

# Fixtures that build a tiny target: a test using one (directly or through another
# fixture) is an integration test.
MODEL_FIXTURES = frozenset(
    {"tiny_target", "tiny_llama_target", "validate_workdir", "tiny_qwen3_moe"}
)

# The files that take longest (seconds measured on 2 cores, two workers): pytest-xdist's
# ``--dist loadfile`` hands each worker whole files in collection order, so these go first
# and the workers finish together instead of one starting the longest file last. A file not
# listed weighs 0 and keeps its place; a stale figure only costs balance, never a result.
FILE_SECONDS = {
    "test_pipeline_dvc.py": 1700,
    "test_real_model.py": 600,
    "test_vllm_compat.py": 330,
    "test_vllm_real.py": 330,
    "test_online.py": 330,
    "test_validate.py": 320,
    "test_training.py": 300,
    "test_integrity.py": 250,
    "test_gpu_proof.py": 200,
    "test_stage_inputs.py": 130,
    "test_dvc_graph.py": 100,
}

# At most this many workers under ``-n auto``: each may hold a vLLM server and a model.
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


def _share_cores() -> None:
    """Under pytest-xdist, each worker's torch (and the stages and servers it starts, which
    inherit the environment) gets its share of the cores: OpenMP's spinning threads, two
    per process on two cores shared by two workers, would otherwise steal each other's time."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0))
        os.environ["OMP_NUM_THREADS"] = str(max(1, cores // int(workers)))


_share_cores()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(
        key=lambda item: -FILE_SECONDS.get(item.path.name, 0)
    )  # stable: order kept within a file
    for item in items:
        if item.get_closest_marker("slow") or item.get_closest_marker("integration"):
            continue
        fixtures = set(getattr(item, "fixturenames", ()))
        item.add_marker(pytest.mark.integration if fixtures & MODEL_FIXTURES else pytest.mark.quick)


def _starts_dvc(args: object) -> bool:
    argv = [str(a) for a in args] if isinstance(args, list | tuple) else str(args).split()
    names = [Path(a).name for a in argv[:3]]
    return bool(names) and (names[0] == "dvc" or names[1:3] == ["-m", "dvc"])


@pytest.fixture(autouse=True)
def _cwd_restored() -> Iterator[None]:
    """Every test starts in the directory the suite started in, whatever the last one did.

    A test that changes directory and fails before changing back would otherwise make every
    later test that names a relative path depend on the order the suite ran in.
    """
    old = os.getcwd()
    yield
    os.chdir(old)


@pytest.fixture(autouse=True)
def _quick_tests_run_no_dvc(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quick tier's promise, kept: a quick test that starts a DVC command fails."""
    if request.node.get_closest_marker("quick") is None:
        return
    real = subprocess.Popen

    class NoDvcPopen(real):  # type: ignore[misc,valid-type]
        def __init__(self, args: object, *a: object, **kw: object) -> None:
            if _starts_dvc(args):
                raise AssertionError(f"a quick test ran DVC ({args}); mark it integration")
            super().__init__(args, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", NoDvcPopen)


@contextlib.contextmanager
def _no_models() -> Iterator[None]:
    """While active, building any transformers or speculators ``PreTrainedModel`` (a target,
    a draft) or running a backward pass raises."""
    import torch
    from transformers import PreTrainedModel

    def no_model(self: PreTrainedModel, *a: object, **kw: object) -> None:
        raise AssertionError(
            f"a quick test built a model ({type(self).__name__}); mark it integration"
        )

    def no_backward(self: torch.Tensor, *a: object, **kw: object) -> None:
        raise AssertionError("a quick test ran a backward pass; mark it integration")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PreTrainedModel, "__init__", no_model)
        mp.setattr(torch.Tensor, "backward", no_backward)
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """The quick tier's other promise: a quick test that builds a model or trains, in its
    fixtures (a module-scoped one too: it is set up for the first test that asks) or in its
    body, fails."""
    if item.get_closest_marker("quick") is None:
        return (yield)
    with _no_models():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("quick") is None:
        return (yield)
    with _no_models():
        return (yield)


# reduced settings for fast tests: a few target steps is enough to exercise every path
TINY_STEPS = 30


def build_target_workdir(root: Path, *overrides: str) -> Path:
    """Run the real `target` stage in a fresh working directory (conf/ copied in)."""
    from eagle3_pipeline.stages.target import main

    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(CONF, root / "conf", dirs_exist_ok=True)
    old = os.getcwd()
    os.chdir(root)
    try:
        main([f"target.train_steps={TINY_STEPS}", *overrides])
    finally:
        os.chdir(old)
    return root


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory holding data/target/ for the tiny Kimi-K2.5 (30 train steps)."""
    return build_target_workdir(tmp_path_factory.mktemp("tiny_kimi"))


@pytest.fixture(scope="session")
def tiny_llama_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory holding data/target/ for the tiny Llama (30 train steps)."""
    return build_target_workdir(tmp_path_factory.mktemp("tiny_llama"), "model=tiny_llama")


@pytest.fixture(scope="session")
def validate_workdir(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Kimi-K2.5 with an (untrained) draft saved as the train stage saves it and
    three held-out prompts: what the validate stage and the vLLM tests start from. Copy it
    before changing anything in it."""
    from workdirs import make_workdir

    return make_workdir(tiny_target, tmp_path_factory.mktemp("vllm_work"))


@pytest.fixture
def in_dir(tmp_path: Path):
    """chdir into a fresh directory with conf/ copied in; restore afterwards."""
    shutil.copytree(CONF, tmp_path / "conf")
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(old)


@pytest.fixture(scope="module")
def single_thread() -> Iterator[None]:
    """One intra-op thread for the evaluator tests: the tiny target's forwards are
    call-overhead bound, and on a shared 2-core machine extra threads only add contention."""
    import torch  # here, not at module level: the quick tier never needs torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
