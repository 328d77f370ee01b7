"""Acceptance at T=0 by replaying the target's greedy answers: the same counts as chained
speculative decoding, with the target's forwards batched across prompts.

Why: greedy speculative decoding is lossless, so every token it produces is the target's
greedy token, and a step's acceptance is the number of leading drafts that equal the next
greedy tokens. Given the greedy continuation ``y`` of a prompt, each verification's answer
is known in advance (``y`` from the step's position on) and so are the aux states the
draft reads (one teacher-forced target forward over ``prompt + y``). What remains
sequential is only the draft's own chain, a one-layer model. The chained evaluator spends
most of its time in one small target forward per step per prompt (K + 1 positions, call
overhead bound on a CPU); here the target runs:

1. greedy generation of a batch of prompts at once (left-padded, KV cache), each row
   carried K tokens past its stop or length cap, since a step that reaches the end still
   compares its drafts with the target's tokens there (vLLM's counter counts them);
2. one forward over ``prompt + y`` per prompt, whose argmax must reproduce ``y`` at every
   position: that is the lossless check (:func:`acceptance.greedy_check`'s, on the same
   prefix), and it guards the replay. A row that batching moved off the greedy path (a
   near-tie rounded the other way beside padding) is decoded by the chained evaluator
   instead, so the figures never rest on a sequence the target would not produce.

The walk then runs :func:`acceptance.speculative_decode` itself, with :class:`Replay` as
its verifier: the same loop, counts and truncation as the chained evaluator.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from eagle3_pipeline.core.config import ConfigError
from eagle3_pipeline.validate.acceptance import (
    AcceptanceResult,
    CachedDraft,
    CachedTarget,
    Prompt,
    PromptResult,
    SpeculatorsDraft,
    Target,
    greedy_check,
    pool,
    speculative_decode,
)

log = logging.getLogger(__name__)


@dataclass
class Replay:
    """The verifier interface of ``speculative_decode`` over a known greedy continuation.

    ``y``: the target's greedy tokens after the prompt (K past the answer's end); ``aux``:
    the aux states of every position of ``prompt + y[:-1]``."""

    prompt_len: int
    y: list[int]
    aux: Any

    def start_ids(self, prompt_ids: Sequence[int]) -> tuple[int, Any]:
        return self.y[0], self.aux[: self.prompt_len]

    def verify_ids(self, ctx: Sequence[int], drafts: Sequence[int]) -> tuple[list[int], Any]:
        j = len(ctx) - self.prompt_len  # y[j] is the greedy token after ctx
        preds = self.y[j : j + len(drafts) + 1]
        if len(preds) != len(drafts) + 1:
            raise ValueError(f"replay: {len(self.y)} greedy tokens, a step at {j} needs more")
        return preds, None

    def keep(self, ctx_len: int, accepted: int, aux: Any, verified: Any) -> Any:
        return self.aux[: ctx_len + accepted]


def _keeps_logits(model: Any) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def needed(y: Sequence[int], k: int, max_new_tokens: int, stop: set[int]) -> int | None:
    """How many greedy tokens the replay of ``y`` needs (the answer and K more), or None
    while the answer has not ended yet."""
    for i, tok in enumerate(y[:max_new_tokens]):
        if tok in stop:
            return i + 1 + k
    return max_new_tokens + k if len(y) >= max_new_tokens else None


def greedy_batch(
    target: Target,
    prompts: Sequence[Sequence[int]],
    k: int,
    max_new_tokens: int,
    stop_ids: Iterable[int],
    pad_id: int = 0,
) -> list[list[int]]:
    """Greedy continuations of several prompts in one batch: left-padded, the positions
    counted from each row's first real token, a KV cache. Each row is carried until
    :func:`needed` is met; rows that are done ride along until the last one is."""
    import torch
    from transformers import DynamicCache

    stop = set(stop_ids)
    lm, dev = target.lm.model, target.device
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), longest), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, longest - len(p) :] = torch.tensor(list(p))
        mask[b, longest - len(p) :] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    extra = {"logits_to_keep": 1} if _keeps_logits(lm) else {}
    cache = DynamicCache()
    ys: list[list[int]] = [[] for _ in prompts]
    want: list[int | None] = [None] * len(prompts)
    x = ids
    with torch.no_grad():
        while True:
            logits = lm(
                input_ids=x,
                attention_mask=mask,
                position_ids=pos,
                past_key_values=cache,
                use_cache=True,
                **extra,
            ).logits[:, -1]
            target.capture.clear()
            tok = logits.float().argmax(-1)
            for b, t in enumerate(tok.tolist()):
                if want[b] is None or len(ys[b]) < want[b]:  # type: ignore[operator]
                    ys[b].append(t)
                    if want[b] is None:
                        want[b] = needed(ys[b], k, max_new_tokens, stop)
            if all(w is not None and len(y) >= w for w, y in zip(want, ys, strict=True)):
                break
            x = tok[:, None]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
            pos = pos[:, -1:] + 1
    return ys


def teacher_forced(target: Target, prompt_ids: Sequence[int], y: Sequence[int]) -> tuple[Any, Any]:
    """One forward over ``prompt + y[:-1]``: the greedy token at each of ``y``'s positions
    (``[len(y)]``) and the aux states of every position (``[P + len(y) - 1, n_aux * H]``)."""
    import torch

    lm = target.lm.model
    x = torch.tensor([[*prompt_ids, *y[:-1]]], dtype=torch.long, device=target.device)
    extra = {"logits_to_keep": len(y)} if _keeps_logits(lm) else {}
    with torch.no_grad():
        logits = lm(input_ids=x, use_cache=False, **extra).logits[0].float()
    states = target.capture.take()[0]
    return logits[-len(y) :].argmax(-1), states[:, :-1].flatten(1)


def replays(
    target: Target,
    prompts: Sequence[Prompt],
    k: int,
    max_new_tokens: int,
    stop_ids: Iterable[int],
    batch_size: int,
    progress: bool = False,
) -> list[Replay | None]:
    """A :class:`Replay` per prompt, or None where the batched continuation is not the
    target's greedy one (that prompt is then decoded by the chained evaluator)."""
    import torch

    stop = list(stop_ids)
    out: list[Replay | None] = []
    bar: Any = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(
            total=len(prompts), desc=f"greedy answers (batches of {batch_size})", unit="prompt"
        )
    for i in range(0, len(prompts), batch_size):
        batch = prompts[i : i + batch_size]
        ys = greedy_batch(target, [p.prompt_ids for p in batch], k, max_new_tokens, stop)
        for p, y in zip(batch, ys, strict=True):
            greedy, aux = teacher_forced(target, p.prompt_ids, y)
            if torch.equal(greedy.cpu(), torch.tensor(y)):
                out.append(Replay(len(p.prompt_ids), y, aux))
            else:
                log.info(
                    "prompt %s: its batched answer left the greedy path; decoded chained", p.id
                )
                out.append(None)
        if bar is not None:
            bar.update(len(batch))
    if bar is not None:
        bar.close()
    return out


def measure(
    target: Target,
    draft: SpeculatorsDraft,
    prompts: Sequence[Prompt],
    k: int,
    max_new_tokens: int,
    stop_ids: Iterable[int],
    batch_size: int = 16,
    progress: bool = False,
) -> tuple[AcceptanceResult, list[PromptResult]]:
    """:func:`acceptance.measure` at T=0 with the target batched: the same figures, every
    answer checked lossless (the teacher-forced forward the replay needs is the check)."""
    if k < 1:
        raise ConfigError(f"K={k} must be >= 1")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens} must be >= 1")
    if batch_size < 1:
        raise ConfigError(f"validate.batch_size={batch_size} must be >= 1")
    stop = list(stop_ids)
    plans = replays(target, prompts, k, max_new_tokens, stop, batch_size, progress)
    chained, cached = CachedTarget(target), CachedDraft(draft)
    results: list[PromptResult] = []
    it: Iterable[tuple[Prompt, Replay | None]] = zip(prompts, plans, strict=True)
    if progress:
        from tqdm import tqdm

        it = tqdm(list(it), desc=f"draft replay (K={k})", unit="prompt")
    for p, plan in it:
        if plan is None:
            r = speculative_decode(chained, cached, p, k, max_new_tokens, stop)
            verdict = greedy_check(target, p.prompt_ids, r.tokens)
            r.lossless = verdict.lossless
            r.first_divergence = verdict.first_divergence
            r.divergence_margin = verdict.divergence_margin
        else:
            r = speculative_decode(plan, cached, p, k, max_new_tokens, stop)
            r.lossless = True  # its answer passed the teacher-forced check in replays()
        results.append(r)
    return pool(results, k, max_new_tokens), results
