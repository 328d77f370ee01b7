"""KV caches for the acceptance evaluator: a target and a draft that
:func:`~eagle3_pipeline.validate.acceptance.speculative_decode` drives exactly as the
recomputing ones, with the same tokens and counts, without recomputing the prefix.

Why: the recomputing evaluator runs the target over the whole sequence at every
verification and the draft over the whole prefix every round -- O(n^2) in generated
length. Fine for the tiny target; prohibitive for an 8B target on one GPU, which users run
before paying for vLLM time. Here:

- the target keeps a KV cache of every token whose state is final. A verification feeds
  only the last produced token and the K drafts (K + 1 positions), then crops the cache
  back to the accepted prefix (rejected drafts roll back);
- the draft keeps a KV cache of its prefix positions. A round feeds only the pairs that are
  new since the last round, runs its K - 1 chained steps on top, then crops them away.

The aux states the draft reads are kept from each verification's own forward (the same
rows the recomputing evaluator slices from its full forward).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eagle3_pipeline.validate.acceptance import SpeculatorsDraft, Target, torch_arange


class CachedTarget:
    """A :class:`Target` run incrementally over one sequence at a time."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.cache: Any = None

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache()

    def extend(self, ids: Sequence[int]) -> tuple[Any, Any]:
        """Feed ``ids`` after the cached tokens: ``(logits [n, V] float32, aux [n, n_aux*H])``
        of the new positions (one target forward)."""
        import torch

        t = self.target
        t.forwards += 1
        x = torch.tensor([list(ids)], dtype=torch.long, device=t.device)
        with torch.no_grad():
            logits = t.lm.model(input_ids=x, past_key_values=self.cache,
                                use_cache=True).logits[0].float()  # fmt: skip
        return logits, t.capture.take()[0][:, :-1].flatten(1)

    # the verifier interface of eagle3_pipeline.validate.acceptance.Target

    def start(self, prompt_ids: Sequence[int]) -> tuple[Any, Any]:
        self.reset()
        logits, aux = self.extend(prompt_ids)
        return logits[-1], aux

    def verify(self, ctx: Sequence[int], drafts: Sequence[int]) -> tuple[Any, Any]:
        """The cache holds ``ctx[:-1]``: only the last produced token and the drafts are
        fed (K + 1 positions)."""
        return self.extend([ctx[-1], *drafts])

    def keep(self, ctx_len: int, accepted: int, aux: Any, verified: Any) -> Any:
        """Roll the rejected drafts back out of the cache; append the kept rows' aux."""
        import torch

        keep_first(self.cache, ctx_len + accepted)
        return torch.cat([aux, verified[: accepted + 1]])


def keep_first(cache: Any, length: int) -> None:
    """Drop every cached position from ``length`` on. Why not ``crop(length)``: transformers
    5 reads a positive argument as a size (deprecated) and a negative one as a count to
    drop, and ``crop(0)`` once meant "drop everything"; a negative count means the same in
    every version we accept."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


class CachedDraft:
    """A :class:`SpeculatorsDraft` whose prefix positions stay in a KV cache between
    rounds; the chained steps of a round are cropped away after it."""

    def __init__(self, draft: SpeculatorsDraft) -> None:
        self.draft = draft
        self.cache: Any = None

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache()

    def propose(self, tokens: Sequence[int], aux: Any, k: int) -> list[int]:
        import torch

        d = self.draft
        n = len(tokens)
        if aux.shape[0] != n - 1:
            raise ValueError(f"aux has {aux.shape[0]} rows, expected {n - 1}")
        done = self.cache.get_seq_length()  # pairs 0..done-1 are cached
        dtype = next(d.model.parameters()).dtype
        with torch.no_grad():
            x = d.pairs(tokens, aux, done)
            new = n - 1 - done
            positions = torch_arange(done + 1, n, d.device).unsqueeze(0)
            mask = torch.zeros((new, done + new), dtype=dtype, device=d.device)
            mask[:, done:] = torch.triu(torch.full((new, new), float("-inf"), dtype=dtype,
                                                   device=d.device), diagonal=1)  # fmt: skip
            out = d._layers(x, positions, self.cache, mask[None, None])[:, -1:]
            proposed = d.chain(out, n, k, self.cache)
            keep_first(self.cache, n - 1)  # the chain's entries are this round's only
        return proposed
