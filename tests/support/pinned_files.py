"""The pinned files ``eagle3-fetch`` brings (benchmarks, ShareGPT), for tests that need the
real ones: skipped when absent, a failure where CI requires them
(``EAGLE3_REQUIRE_REAL_MODEL=1``, set by .ci/run after fetching them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def fetched_benchmark(name: str) -> Path:
    """The repository's fetched copy of benchmark ``name`` (core/benchmarks.py)."""
    from eagle3_pipeline.core.benchmarks import BENCHMARKS

    path = REPO / BENCHMARKS[name].path
    if not path.is_file():
        why = f"{path} is missing: run `eagle3-fetch {name}`"
        if os.environ.get("EAGLE3_REQUIRE_REAL_MODEL") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return path


def link_benchmarks(root: Path, *names: str) -> None:
    """Make ``root``'s ``fetched/`` hold the fetched benchmark files (a test working
    directory stands for a repository root)."""
    from eagle3_pipeline.core.benchmarks import BENCHMARKS

    for name in names:
        src = fetched_benchmark(name)
        dst = root / BENCHMARKS[name].path
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists():
            dst.symlink_to(src)
