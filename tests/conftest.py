"""Shared fixtures. Expensive things (the tiny targets) are built once per session."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"

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
