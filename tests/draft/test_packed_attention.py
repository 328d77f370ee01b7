"""``sdpa_packed`` (the CPU training default) against plain SDPA on speculators' own
packed-document masks: the same outputs and gradients to float32 rounding, and the mask
really is cut into pieces (if speculators changes its mask layout, the pieces test fails
instead of the speedup silently disappearing)."""

from __future__ import annotations

import pytest
import torch

from eagle3_pipeline.draft.packed_attention import (
    MIN_PIECE,
    causal_diagonal_attention,
    is_causal_diagonal,
    pieces_for,
    sdpa_packed_forward,
)


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
    # bidirectional within one document: no cut, and not causal either
    causal = torch.ones(n, n, dtype=torch.bool).view(1, 1, n, n)
    assert pieces_for(causal, n, n) is None
    q, k, v = (torch.randn(1, 4, n, 8) for _ in range(3))
    k, v = k[:, :2], v[:, :2]
    a, _ = sdpa_attention_forward(_Layer(), q, k, v, causal, dropout=0.0, scaling=0.3)
    b, _ = sdpa_packed_forward(_Layer(), q, k, v, causal, dropout=0.0, scaling=0.3)
    assert torch.equal(a, b)


def _dense(size: int, blocks: int) -> torch.Tensor:
    """The mask of one document at TTT step ``blocks - 1``: causal, then diagonals."""
    causal = torch.ones(size, size, dtype=torch.bool).tril()
    eye = torch.eye(size, dtype=torch.bool)
    return torch.cat([causal] + [eye] * (blocks - 1), dim=1).view(1, 1, size, size * blocks)


def _grads(out: torch.Tensor, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    w = torch.linspace(-1, 1, out.numel()).view_as(out)
    return torch.autograd.grad((out.float() * w).sum(), xs)


@pytest.mark.parametrize("blocks", [1, 2, 3])
def test_the_causal_diagonal_kernel_equals_masked_sdpa(blocks: int) -> None:
    """Causal flash plus diagonal dot products, merged by log-sum-exp, against SDPA with
    the dense mask: outputs and gradients equal to float32 rounding."""
    torch.manual_seed(blocks)
    s, d = 150, 16
    q = torch.randn(1, 3, s, d, requires_grad=True)
    k = torch.randn(1, 3, s, blocks, d, requires_grad=True)
    v = torch.randn(1, 3, s, blocks, d, requires_grad=True)
    ours = causal_diagonal_attention(q, k, v, 0.3)
    flat_k = k.transpose(2, 3).reshape(1, 3, blocks * s, d)  # block-major, as the mask
    flat_v = v.transpose(2, 3).reshape(1, 3, blocks * s, d)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, flat_k, flat_v, attn_mask=_dense(s, blocks), scale=0.3
    )
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    for a, b in zip(_grads(ours, q, k, v), _grads(ref, q, k, v), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_causal_diagonal_kernel_in_bf16_keeps_to_bf16_rounding() -> None:
    """In bf16 (autocast's dtype on a CPU with AMX) the result is within bf16's rounding of
    the float32 one, as masked SDPA in bf16 is."""
    torch.manual_seed(7)
    s, d, blocks = 200, 32, 3
    q, k, v = (
        torch.randn(1, 2, s, d),
        torch.randn(1, 2, s, blocks, d),
        torch.randn(1, 2, s, blocks, d),
    )
    exact = causal_diagonal_attention(q, k, v, d**-0.5)
    ours = causal_diagonal_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), d**-0.5)
    masked = torch.nn.functional.scaled_dot_product_attention(
        q.bfloat16(),
        k.bfloat16().transpose(2, 3).reshape(1, 2, blocks * s, d),
        v.bfloat16().transpose(2, 3).reshape(1, 2, blocks * s, d),
        attn_mask=_dense(s, blocks),
    )
    assert ours.dtype == torch.bfloat16
    ours_err = (ours.float() - exact).abs().max().item()
    masked_err = (masked.float() - exact).abs().max().item()
    assert ours_err < 0.05 and ours_err <= 2 * masked_err


def test_single_document_pieces_take_the_causal_diagonal_kernel() -> None:
    """The pieces of one document each are causal-diagonal at every TTT step; a piece that
    merged a short row with padding is not (and keeps the masked kernel); so is a whole
    pack of one document (no cut)."""
    lengths, pad = [130, 70, 200, 90, 31], 41
    n = sum(lengths) + pad
    for step in range(3):
        blocks = step + 1
        mask = _masks(lengths, pad, blocks)[step]
        pieces = pieces_for(mask, n, n * blocks)
        assert pieces is not None
        layout = mask[0, 0].reshape(n, blocks, n).transpose(1, 2)
        kinds = [is_causal_diagonal(layout[s:e, s:e]) for s, e in pieces]
        assert kinds[:4] == [True] * 4 and kinds[-1] is False
    one = _masks([300], 0, 3)[2]
    assert pieces_for(one, 300, 900) is None
    assert is_causal_diagonal(one[0, 0].reshape(300, 3, 300).transpose(1, 2))


def test_a_one_document_pack_equals_sdpa() -> None:
    """A pack that is one document (no cut) also takes the kernel: same as SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    n, blocks = 256, 3
    mask = _masks([n], 0, blocks)[blocks - 1]
    torch.manual_seed(3)
    q = torch.randn(1, 4, n, 16, requires_grad=True)
    k = torch.randn(1, 2, n * blocks, 16, requires_grad=True)
    v = torch.randn(1, 2, n * blocks, 16, requires_grad=True)
    a, _ = sdpa_attention_forward(_Layer(), q, k, v, mask, dropout=0.0, scaling=0.25)
    b, _ = sdpa_packed_forward(_Layer(), q, k, v, mask, dropout=0.0, scaling=0.25)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    for x, y in zip(_grads(b, q, k, v), _grads(a, q, k, v), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
