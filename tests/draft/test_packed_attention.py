"""``sdpa_packed`` (the CPU training default) against plain SDPA on speculators' own
packed-document masks: the same outputs and gradients to float32 rounding, and the mask
really is cut into pieces (if speculators changes its mask layout, the pieces test fails
instead of the speedup silently disappearing)."""

from __future__ import annotations

import pytest
import torch

from eagle3_pipeline.draft.packed_attention import MIN_PIECE, pieces_for, sdpa_packed_forward


class _Layer(torch.nn.Module):
    num_key_value_groups = 2  # grouped-query attention, as the tiny drafts may have
    is_causal = True


def _masks(lengths: list[int], pad: int, steps: int) -> list[torch.Tensor]:
    """speculators' dense masks for TTT steps 0..steps-1 of one pack."""
    from speculators.models.eagle3.attention import (
        create_combined_mask_mod,
        extend_dense_mask_for_draft_tokens,
    )
    from torch.nn.attention.flex_attention import create_mask

    doc = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)] + [torch.full((pad,), -1)])
    n = doc.numel()
    mask = create_mask(create_combined_mask_mod(doc, n), 1, 1, n, n, device="cpu")
    out = [mask]
    for _ in range(steps - 1):
        mask = extend_dense_mask_for_draft_tokens(mask, n)
        out.append(mask)
    return out


@pytest.mark.parametrize("step", [0, 1, 2])
def test_same_outputs_and_gradients_as_sdpa(step: int) -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    lengths, pad = [130, 70, 200, 90, 31], 41
    mask = _masks(lengths, pad, step + 1)[step]
    n = sum(lengths) + pad
    assert pieces_for(mask, n, n * (step + 1)) is not None  # the fast path is taken
    torch.manual_seed(0)
    q = torch.randn(1, 4, n, 16, requires_grad=True)
    k = torch.randn(1, 2, n * (step + 1), 16, requires_grad=True)
    v = torch.randn(1, 2, n * (step + 1), 16, requires_grad=True)
    layer = _Layer()
    results = []
    for fn in (sdpa_attention_forward, sdpa_packed_forward):
        out, _ = fn(layer, q, k, v, mask, dropout=0.0, scaling=0.25)
        grads = torch.autograd.grad(
            (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(), (q, k, v)
        )
        results.append((out.detach(), grads))
    (a, ga), (b, gb) = results
    assert a.shape == b.shape == (1, n, 4, 16)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    for x, y in zip(gb, ga, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_pieces_follow_the_documents_and_merge_short_ones() -> None:
    lengths, pad = [130, 70, 200, 90, 31], 41
    n = sum(lengths) + pad
    pieces = pieces_for(_masks(lengths, pad, 1)[0], n, n)
    assert pieces is not None
    assert pieces[0][0] == 0 and pieces[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:], strict=False))  # a partition
    starts = {0, 130, 200, 400, 490}  # where documents begin; a padding row (from 521)
    assert {s for s, _ in pieces if s < 521} <= starts  # attends only itself: cut anywhere
    assert all(e - s >= MIN_PIECE for s, e in pieces[:-1])  # short runs merged forward


def test_a_mask_that_attends_across_documents_falls_back_to_sdpa() -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    n = 256
    causal = torch.ones(n, n, dtype=torch.bool).tril().view(1, 1, n, n)
    assert pieces_for(causal, n, n) is None  # one document: nothing to skip
    q, k, v = (torch.randn(1, 4, n, 8) for _ in range(3))
    k, v = k[:, :2], v[:, :2]
    a, _ = sdpa_attention_forward(_Layer(), q, k, v, causal, dropout=0.0, scaling=0.3)
    b, _ = sdpa_packed_forward(_Layer(), q, k, v, causal, dropout=0.0, scaling=0.3)
    assert torch.equal(a, b)
