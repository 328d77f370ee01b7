"""Fixtures of the evaluator tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module")
def single_thread() -> Iterator[None]:
    """One intra-op thread: the tiny target's forwards are call-overhead bound, and on a
    shared 2-core machine extra threads only add contention."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
