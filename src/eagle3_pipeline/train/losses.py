"""The ``cpu`` loss implementation: speculators' eager losses, with the forward KL (the
default ``train.loss``) as one autograd function.

Why: on a CPU the loss over the draft vocabulary is a large share of a step. speculators'
eager ``kl_div_loss`` builds it from ``log_softmax``, ``softmax`` and ``kl_div`` (``xlogy``,
a subtraction, a product) and autograd keeps and walks each of them back; on SmolLM2-135M's
rows (1024 tokens, 4096 draft tokens, 3 TTT steps) that was about 100 ms of a 670 ms bf16
step (an Intel Xeon with AMX, 2 cores). The same value is
``sum_v p_v (log p_v - log q_v)`` with ``p = softmax(targets)``, ``q = softmax(logits)``,
both in float32 as speculators computes them, and its gradient in the logits is
``(q - p) * grad``: two log-softmaxes, one exponential and a product forward, one
exponential, a subtraction and a product back. The loss and its gradient equal the eager
ones to float32 rounding (``tests/train/test_losses.py``); every other loss name keeps
speculators' eager function. On CUDA the fused Triton kernels stay the default.
"""

from __future__ import annotations

import functools
from typing import Any

NAME = "cpu"


def loss_config(spec: str, implementation: str) -> dict[str, Any]:
    """speculators' ``{name: (loss_fn, weight)}`` for ``train.loss``; ``cpu``: the eager
    functions with the forward KL replaced by :func:`kl_div_loss`."""
    from speculators.losses import eager, resolve_loss_config

    if implementation != NAME:
        return resolve_loss_config(spec, implementation)
    config = resolve_loss_config(spec, "eager")
    return {
        name: ((kl_div_loss if fn is eager.kl_div_loss else fn), weight)
        for name, (fn, weight) in config.items()
    }


def kl_div_loss(logits: Any, targets: Any) -> Any:
    """Per-position forward KL ``[1, T]`` of the draft's ``logits`` from the target's
    (``targets``), as speculators' eager ``kl_div_loss``; no gradient to the targets."""
    return _kl_function().apply(logits, targets.detach())


@functools.cache
def _kl_function() -> Any:
    """The autograd function (built on first use: the module imports torch lazily)."""
    import torch

    class ForwardKL(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, logits: Any, targets: Any) -> Any:
            log_q = torch.log_softmax(logits.float(), dim=-1)
            log_p = torch.log_softmax(targets.float(), dim=-1)
            p = log_p.exp()
            loss = (p * (log_p - log_q)).sum(-1)
            ctx.save_for_backward(log_q, p)
            ctx.logits_dtype = logits.dtype
            return loss

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            log_q, p = ctx.saved_tensors
            # (q - p) * grad, in the buffers of the saved tensors (used once)
            grad_logits = log_q.exp_().sub_(p).mul_(grad.unsqueeze(-1))
            return grad_logits.to(ctx.logits_dtype), None

    return ForwardKL
