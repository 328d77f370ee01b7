"""The torch ``expand_kernel`` of :mod:`eagle3_pipeline.compat.vllm_expand`, when it applies,
and that vLLM can find it, without vLLM (quick). The real vLLM's side -- its own expansion
still broken, the plugin fixing it in every process, sampled acceptance -- is in
``tests/compat/test_vllm_compat.py``."""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

import eagle3_pipeline.compat.vllm_expand as vllm_expand

REPO = Path(__file__).resolve().parents[2]


def _expected(x: torch.Tensor, counts: list[int], replace_from: float, replace_to: float):
    values = [replace_to if v == replace_from else v for v in x.tolist()]
    return torch.tensor(
        [v for v, n in zip(values, counts, strict=True) for _ in range(n)], dtype=x.dtype
    )


@pytest.mark.parametrize(
    ("x", "replace_from", "replace_to"),
    [
        (torch.tensor([0.7, 0.5, 0.0, 1.3]), 0, 1),  # temperature: greedy rows divide by 1
        (torch.tensor([0.9, 1.0, 0.5, 0.95], dtype=torch.float64), 0, 0),  # top-p
        (torch.tensor([5, 0, 20, 7], dtype=torch.int32), 0, 0),  # top-k
        (torch.tensor([5, 0, 20, 7]), 0, 0),
    ],
)
def test_expand_kernel_repeats_each_requests_value_over_its_tokens(x, replace_from, replace_to):
    counts = [3, 0, 2, 3]  # a request may have no draft tokens
    cu = torch.tensor([3, 3, 5, 8], dtype=torch.int32)
    out = torch.full((8,), -99, dtype=x.dtype)
    vllm_expand.expand_kernel(out, x, cu, replace_from, replace_to, 128)
    assert out.dtype == x.dtype
    assert torch.equal(out, _expected(x, counts, replace_from, replace_to))
    # only the first cu[-1] tokens are written, as the kernel does
    longer = torch.full((10,), -99, dtype=x.dtype)
    vllm_expand.expand_kernel(longer, x, cu, replace_from, replace_to)
    assert torch.equal(longer[8:], torch.full((2,), -99, dtype=x.dtype))
    empty = torch.empty(0, dtype=x.dtype)
    vllm_expand.expand_kernel(empty, x[:0], cu[:0], replace_from, replace_to)


def test_it_applies_only_where_vllm_runs_its_cpp_fallback() -> None:
    assert vllm_expand.bug_present(is_cpu=True, has_triton=False, has_cpp_replacement=True)
    assert not vllm_expand.bug_present(True, True, True)  # Triton-CPU: the real kernel runs
    assert not vllm_expand.bug_present(False, False, True)  # CUDA and other platforms
    assert not vllm_expand.bug_present(True, False, False)  # the fallback is gone: nothing to fix


def test_the_record_names_the_patch_once_and_only_where_it_applied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(vllm_expand.RECORD_VAR, raising=False)
    assert vllm_expand.applied() == []
    vllm_expand._record(True)
    vllm_expand._record(True)  # vLLM may load a plugin again
    assert vllm_expand.applied() == [vllm_expand.PATCH]
    monkeypatch.setenv(vllm_expand.RECORD_VAR, f"other,{vllm_expand.PATCH}")
    vllm_expand._record(False)  # inherited, but not applied in this process
    assert vllm_expand.applied() == ["other"]


def test_the_plugin_is_a_vllm_general_plugin_entry_point() -> None:
    """vLLM finds plugins by entry point, in every process it starts: the package's
    metadata must declare it (``pip install -e .`` in the vLLM environment registers it)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    target = project["entry-points"]["vllm.general_plugins"][vllm_expand.ENTRY_POINT]
    module, _, attr = target.partition(":")
    assert getattr(import_module(module), attr) is vllm_expand.plugin
    installed = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert installed.get(vllm_expand.ENTRY_POINT) == target, (
        "this environment's eagle3-pipeline metadata predates the entry point: "
        "re-run `pip install --no-deps -e .` here and in the vLLM environment"
    )
