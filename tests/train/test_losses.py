"""The ``cpu`` loss implementation (train/losses.py) against speculators' eager losses:
the same per-position KL and gradient to float32 rounding, in float32 and from bf16
logits; every other loss keeps speculators' function. If speculators renames or
replaces its eager ``kl_div_loss``, the swap test fails instead of the speedup silently
disappearing."""

from __future__ import annotations

import pytest
import torch
from speculators.losses import eager, resolve_loss_config

from eagle3_pipeline.train.losses import NAME, kl_div_loss, loss_config


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_forward_kl_equals_speculators_eager_one(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    logits = (torch.randn(1, 300, 512) * 3).to(dtype)
    targets = (torch.randn(1, 300, 512) * 3).to(dtype)
    weight = torch.linspace(-1, 2, 300).view(1, 300)
    results = []
    for fn in (eager.kl_div_loss, kl_div_loss):
        x = logits.clone().requires_grad_()
        loss = fn(x, targets)
        (grad,) = torch.autograd.grad((loss * weight).sum(), x)
        results.append((loss.detach(), grad))
    (a, ga), (b, gb) = results
    assert a.shape == b.shape == (1, 300) and b.dtype == torch.float32
    assert gb.dtype == dtype
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    if dtype == torch.float32:
        torch.testing.assert_close(gb, ga, rtol=1e-5, atol=1e-6)
    else:  # within bf16's rounding of the gradient
        torch.testing.assert_close(gb, ga)
    assert (b >= -1e-6).all()  # a divergence


def test_the_cpu_implementation_swaps_the_kl_only() -> None:
    config = loss_config('{"kl_div": 0.7, "rkl": 0.3}', NAME)
    stock = resolve_loss_config('{"kl_div": 0.7, "rkl": 0.3}', "eager")
    assert config["kl_div"] == (kl_div_loss, 0.7)
    assert config["rkl"] == stock["rkl"]
    assert loss_config("kl_div", NAME) == {"kl_div": (kl_div_loss, 1.0)}
    assert loss_config("kl_div", "eager") == {"kl_div": (eager.kl_div_loss, 1.0)}


@pytest.mark.integration
def test_the_targets_get_no_gradient() -> None:
    logits = torch.randn(1, 5, 16, requires_grad=True)
    targets = torch.randn(1, 5, 16, requires_grad=True)
    kl_div_loss(logits, targets).sum().backward()
    assert logits.grad is not None and targets.grad is None
