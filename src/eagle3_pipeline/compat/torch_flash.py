"""torch's CPU flash-attention kernels, called for the log-sum-exp they return.

Why: a TTT step's attention is a causal block (the row's own keys) plus, for each earlier
step, one diagonal key per query. Dense SDPA with that mask computes every masked score:
for a piece of ``s`` tokens at TTT step 3, ``3 s^2`` scores of which about ``s^2 / 2 + 2 s``
are attended, and its backward was a fifth of a bf16 train step on SmolLM2-135M's rows (an
Intel Xeon with AMX, 2 cores). :mod:`eagle3_pipeline.draft.packed_attention` computes the
causal block with the kernel's own ``is_causal`` (it skips the upper triangle) and the
diagonal keys as dot products, and merges the two by their log-sum-exp, as FlashAttention
merges split keys. The public ``scaled_dot_product_attention`` does not return the
log-sum-exp; the kernel behind it on a CPU does:

- ``aten::_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, *,
  attn_mask, scale) -> (out [b, h, s, d], logsumexp [b, h, s] float32)``
- ``aten::..._backward(grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, *,
  attn_mask, scale) -> (dq, dk, dv)``, which rebuilds the probabilities from ``logsumexp``
  and its ``delta`` from ``out``: given the merged output and log-sum-exp it returns the
  causal block's share of the merged attention's gradient.

Both are private (checked on torch 2.14); ``tests/compat/test_compat.py`` fails when their
schema changes, and :func:`available` lets a torch without them fall back to plain SDPA.
"""

from __future__ import annotations

from typing import Any

FORWARD = "_scaled_dot_product_flash_attention_for_cpu"
BACKWARD = "_scaled_dot_product_flash_attention_for_cpu_backward"


def available() -> bool:
    """Whether this torch has both kernels (with the arguments this module passes)."""
    import torch

    return hasattr(torch.ops.aten, FORWARD) and hasattr(torch.ops.aten, BACKWARD)


def causal_forward(q: Any, k: Any, v: Any, scale: float) -> tuple[Any, Any]:
    """Causal attention of ``[b, h, s, d]`` tensors: the output and its float32
    log-sum-exp ``[b, h, s]`` (of the scaled scores)."""
    import torch

    out, lse = getattr(torch.ops.aten, FORWARD)(q, k, v, 0.0, True, attn_mask=None, scale=scale)
    return out, lse


def causal_backward(
    grad_out: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, scale: float
) -> tuple[Any, Any, Any]:
    """The causal block's gradients for an attention whose output is ``out`` and whose
    log-sum-exp is ``lse`` (these may include keys outside the block)."""
    import torch

    dq, dk, dv = getattr(torch.ops.aten, BACKWARD)(
        grad_out.contiguous(), q, k, v, out, lse, 0.0, True, attn_mask=None, scale=scale
    )
    return dq, dk, dv
