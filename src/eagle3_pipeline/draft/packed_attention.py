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

A piece that is one document (no merged rows, no padding) is further a causal block plus,
per earlier TTT step, a diagonal: :func:`causal_diagonal_attention` computes the block with
the flash kernel's own causal path (it skips the upper triangle) and the diagonals as dot
products, merged by their log-sum-exp (:mod:`eagle3_pipeline.compat.torch_flash`); at TTT
step 3 that is about a sixth of the masked kernel's scores. Its backward was a fifth of a
bf16 step on SmolLM2-135M's rows before (an Intel Xeon with AMX, 2 cores). A pack that is
one document (nothing to cut) takes the same path.
"""

from __future__ import annotations

import functools
from typing import Any

from eagle3_pipeline.compat import torch_flash

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
    if pieces is None and _whole(attention_mask, n, kv) and dropout == 0.0:
        pieces = [(0, n)]  # one document: the whole pack is one causal-diagonal piece
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
    scale = scaling if scaling is not None else d**-0.5
    fast = dropout == 0.0 and d == dv and torch_flash.available()
    outs = []
    for (s, e), q, k, v in zip(pieces, qs, ks, vs, strict=True):
        size = e - s
        sub = mask[s:e, s:e]  # [query, key position, block]
        if fast and is_causal_diagonal(sub):
            outs.append(causal_diagonal_attention(q, k, v, scale))
            continue
        outs.append(
            torch.nn.functional.scaled_dot_product_attention(
                q,
                k.reshape(b, h, size * blocks, d),
                v.reshape(b, h, size * blocks, dv),
                attn_mask=sub.reshape(1, 1, size, size * blocks),
                dropout_p=dropout,
                scale=scaling,
            )
        )
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def _whole(m: Any, n: int, kv: int) -> bool:
    """Whether an ``[1, 1, n, kv]`` boolean mask is causal-diagonal as a whole."""
    import torch

    if m is None or m.dtype != torch.bool or tuple(m.shape) != (1, 1, n, kv) or kv % n:
        return False
    if not torch_flash.available() or n < MIN_PIECE:
        return False
    return is_causal_diagonal(m[0, 0].reshape(n, kv // n, n).transpose(1, 2))


def is_causal_diagonal(sub: Any) -> bool:
    """Whether a piece's mask ``[query, key position, block]`` is one document's: causal
    in the first block, the diagonal alone in every later block (a piece that merged
    short rows or holds padding is not, and keeps the masked kernel)."""
    import torch

    size = sub.shape[0]
    ones = torch.ones(size, size, dtype=torch.bool, device=sub.device)
    if not torch.equal(sub[:, :, 0], ones.tril()):
        return False
    eye = torch.eye(size, dtype=torch.bool, device=sub.device)
    return all(torch.equal(sub[:, :, j], eye) for j in range(1, sub.shape[2]))


def causal_diagonal_attention(q: Any, k: Any, v: Any, scale: float) -> Any:
    """Attention of ``q [b, h, s, d]`` over keys ``k, v [b, h, s, blocks, d]`` where query
    ``i`` attends keys ``0..i`` of block 0 and key ``i`` of every later block; equal to
    SDPA with that mask, without computing its masked scores (see
    :mod:`eagle3_pipeline.compat.torch_flash`)."""
    if k.shape[3] == 1:
        import torch

        return torch.nn.functional.scaled_dot_product_attention(
            q, k[:, :, :, 0], v[:, :, :, 0], is_causal=True, scale=scale
        )
    return _causal_diagonal_function().apply(q, k, v, scale)


def _merge(q: Any, k: Any, v: Any, scale: float) -> tuple[Any, Any, Any, Any, Any]:
    """Forward: the causal block by the flash kernel, the diagonal keys as dot products,
    merged by their log-sum-exp (in float32). Returns the output (in q's dtype), the
    merged log-sum-exp, the diagonal keys' probabilities and the causal block's k, v."""
    import torch

    k0, v0 = k[:, :, :, 0].contiguous(), v[:, :, :, 0].contiguous()
    out0, lse0 = torch_flash.causal_forward(q, k0, v0, scale)
    diag = (q.float().unsqueeze(3) * k[:, :, :, 1:].float()).sum(-1) * scale  # [b,h,s,B-1]
    lse = torch.logsumexp(torch.cat([lse0.unsqueeze(-1), diag], dim=-1), dim=-1)
    p = torch.exp(diag - lse.unsqueeze(-1))
    out = out0.float() * torch.exp(lse0 - lse).unsqueeze(-1)
    out = out + (p.unsqueeze(-1) * v[:, :, :, 1:].float()).sum(3)
    return out.to(q.dtype), lse, p, k0, v0


@functools.cache
def _causal_diagonal_function() -> Any:
    """The autograd function (built on first use: this module imports torch lazily)."""
    import torch

    class CausalDiagonal(torch.autograd.Function):
        """Backward: the flash kernel's, given the merged output and log-sum-exp, is the
        causal block's share of the gradient; the diagonal keys' share is elementwise
        (``dS = P (dO . v - delta)``, ``delta = dO . out``)."""

        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, scale: float) -> Any:
            out, lse, p, k0, v0 = _merge(q, k, v, scale)
            ctx.save_for_backward(q, k, v, k0, v0, out, lse, p)
            ctx.scale = scale
            return out

        @staticmethod
        def backward(ctx: Any, grad_out: Any) -> Any:
            q, k, v, k0, v0, out, lse, p = ctx.saved_tensors
            scale = ctx.scale
            dq0, dk0, dv0 = torch_flash.causal_backward(grad_out, q, k0, v0, out, lse, scale)
            g = grad_out.float()
            delta = (g * out.float()).sum(-1, keepdim=True)  # [b,h,s,1]
            vd, kd = v[:, :, :, 1:].float(), k[:, :, :, 1:].float()
            ds = p * ((g.unsqueeze(3) * vd).sum(-1) - delta) * scale  # [b,h,s,B-1]
            dq = dq0.float() + (ds.unsqueeze(-1) * kd).sum(3)
            dk = torch.cat([dk0.unsqueeze(3).float(), ds.unsqueeze(-1) * q.float().unsqueeze(3)], 3)
            dv = torch.cat([dv0.unsqueeze(3).float(), p.unsqueeze(-1) * g.unsqueeze(3)], 3)
            return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None

    return CausalDiagonal


def register() -> None:
    """Make ``sdpa_packed`` an attention implementation transformers' layers can use."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, sdpa_packed_forward)
