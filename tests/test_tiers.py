"""The test tiers keep their promises: a test left in the quick tier that builds a model or
trains fails, in its body or in a module-scoped fixture, while one marked integration may.

Run in a fresh pytest process over our own conftest: in this process the quick tier's
guard is active around this very test, which would make any inner failure meaningless.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parent / "conftest.py"

INNER = """
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

CFG = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
           num_attention_heads=2, num_key_value_heads=1, vocab_size=32)


@pytest.fixture(scope="module")
def model():
    return LlamaForCausalLM(LlamaConfig(**CFG))


def test_quick_builds_in_body():
    LlamaForCausalLM(LlamaConfig(**CFG))


def test_quick_builds_in_module_fixture(model):
    pass


def test_quick_trains():
    w = torch.ones(2, requires_grad=True)
    (w * 2).sum().backward()


def test_quick_plain_torch_is_fine():
    assert torch.nn.Linear(2, 2)(torch.ones(1, 2)).shape == (1, 2)


@pytest.mark.integration
def test_integration_builds_and_trains():
    m = LlamaForCausalLM(LlamaConfig(**CFG))
    m(input_ids=torch.tensor([[1, 2]])).logits.sum().backward()
"""


def test_a_quick_test_that_builds_or_trains_fails(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text(encoding="utf-8"))
    pytester.makepyfile(test_inner=INNER)
    pytester.makeini("[pytest]\nmarkers =\n    quick: q\n    integration: i\n    slow: s\n")
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-rA")
    result.assert_outcomes(passed=2, failed=2, errors=1)
    out = result.stdout.str()
    assert "a quick test built a model (LlamaForCausalLM); mark it integration" in out
    assert "a quick test ran a backward pass; mark it integration" in out
    for name in ("test_quick_plain_torch_is_fine", "test_integration_builds_and_trains"):
        assert f"PASSED test_inner.py::{name}" in out
