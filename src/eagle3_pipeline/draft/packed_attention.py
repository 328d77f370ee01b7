"""``sdpa_packed``: SDPA per packed document, the CPU counterpart of flex attention's
block sparsity.

A training step packs several rows into one sequence of ``train.tokens_per_step`` tokens
and speculators builds one dense mask over it: causal within each row, plus, for the TTT
steps after the first, one diagonal entry per earlier step's keys. On CUDA flex attention
skips the blocks that mask zeroes; dense SDPA (all there is on CPU without a compiler)
computes them all: for a pack of P rows of similar length about P times the work needed,
and attention is most of a CPU step.

This function cuts the sequence where no query attends across the cut (found from the mask
itself: a cut at i is valid when no row at or after i attends a key before i in the first
block, and the later blocks are diagonal) and runs transformers' own SDPA function on each
piece with its own sub-mask. It first checks that the pieces hold every attended entry of
the mask; any mask where they do not (another layout, a future speculators) is computed
whole, as plain ``sdpa`` would. The sums are the same; only the order of the additions
inside the kernel differs, so losses agree with ``sdpa`` to float rounding, not bit for bit.
"""

from __future__ import annotations

from typing import Any

NAME = "sdpa_packed"
MIN_PIECE = 64  # tokens: smaller runs (padding rows, short rows) are merged into one piece


def _pieces(mask0: Any, min_piece: int) -> list[tuple[int, int]]:
    """Cuts of ``[0, n)`` that no query of the first key block attends across."""
    import torch

    n = mask0.shape[-1]
    first = mask0.to(torch.int8).argmax(dim=-1)  # each row's first attended key
    # a cut at i is valid when every row r >= i attends nothing before i
    suffix_min = torch.flip(torch.cummin(torch.flip(first, [0]), 0).values, [0])
    valid = (suffix_min >= torch.arange(n, device=first.device)).tolist()
    pieces: list[tuple[int, int]] = []
    start = 0
    for i in range(1, n):
        if valid[i] and i - start >= min_piece:
            pieces.append((start, i))
            start = i
    pieces.append((start, n))
    return pieces


def pieces_for(attention_mask: Any, n: int, kv: int) -> list[tuple[int, int]] | None:
    """The cuts of an ``[1, 1, n, kv]`` boolean mask into pieces that hold every attended
    entry (keys of block j of piece (s, e) at ``j * n + s .. j * n + e``), or None when
    the mask is not that layout or gives a single piece."""
    import torch

    m = attention_mask
    if (
        m is None
        or m.dtype != torch.bool
        or m.dim() != 4
        or m.shape[0] != 1
        or m.shape[1] != 1
        or kv % n
        or tuple(m.shape[-2:]) != (n, kv)
        or n < 2 * MIN_PIECE
    ):
        return None
    blocks = kv // n
    pieces = _pieces(m[0, 0, :, :n], MIN_PIECE)
    if len(pieces) == 1:
        return None
    sizes = torch.tensor([e - s for s, e in pieces], device=m.device)
    piece = torch.repeat_interleave(torch.arange(len(pieces), device=m.device), sizes)
    across = piece.view(n, 1, 1) != piece.view(1, 1, n)  # [query, block, key position]
    outside = m[0, 0].reshape(n, blocks, n) & across
    if int(outside.view(torch.uint8).max()):  # not our layout (max: 30x faster than any)
        return None
    return pieces


def sdpa_packed_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """Same signature and result as transformers' ``sdpa_attention_forward``, whose calls
    it makes per piece: the grouped keys repeated (as it does with a mask), then
    ``torch.nn.functional.scaled_dot_product_attention`` with the piece's mask."""
    import torch
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    n, kv = query.shape[2], key.shape[2]
    pieces = None
    if kwargs.get("position_bias") is None and kwargs.get("cache") is None:
        pieces = pieces_for(attention_mask, n, kv)
    if pieces is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    blocks = kv // n
    mask = attention_mask[0, 0].reshape(n, blocks, n).transpose(1, 2)  # [query, key pos, block]
    # keys ordered (position, block), so a piece's keys are one slice; split() keeps the
    # backward to one concatenation (a slice per piece would allocate a full-size gradient)
    sizes = [e - s for s, e in pieces]
    b, h, _, d = key.shape
    dv = value.shape[-1]  # MLA: the value head is narrower than the query/key head
    ks = key.view(b, h, blocks, n, d).transpose(2, 3).split(sizes, dim=2)
    vs = value.view(b, h, blocks, n, dv).transpose(2, 3).split(sizes, dim=2)
    qs = query.split(sizes, dim=2)
    outs = []
    for (s, e), q, k, v in zip(pieces, qs, ks, vs, strict=True):
        size = e - s
        sub = mask[s:e, s:e].reshape(1, 1, size, size * blocks)
        outs.append(
            torch.nn.functional.scaled_dot_product_attention(
                q,
                k.reshape(b, h, size * blocks, d),
                v.reshape(b, h, size * blocks, dv),
                attn_mask=sub,
                dropout_p=dropout,
                scale=scaling,
            )
        )
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def register() -> None:
    """Make ``sdpa_packed`` an attention implementation transformers' layers can use."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, sdpa_packed_forward)
