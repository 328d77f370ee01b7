"""Acceptance length by real, chained, greedy speculative decoding against the target.

Why measure it this way: a draft's training accuracy is teacher-forced (every TTT step is
fed the ground-truth token), so it overstates what the draft buys at inference, where the
draft chains on its own guesses and a single miss ends the round. Here the draft proposes
K tokens exactly as EAGLE-3 does at serve time, the target verifies them in one forward,
and the accepted prefix plus one bonus token is kept; acceptance length is the number of
tokens produced per target verification forward (the prefill excluded), pooled over all
prompts. Greedy speculative decoding is lossless: the produced tokens must equal the
target's plain greedy decoding, which is checked on every prompt.

How EAGLE-3 feeds its draft (speculators 0.9 ``Eagle3DraftModel.forward`` + ``shift_batch``):
the draft input at position t pairs the target's aux hidden states at t (``fc`` of the
concatenated residual streams entering the aux layers) with the embedding of token t+1,
at rotary position t+1, and its output there predicts token t+2. After the last real
position, each further draft token is chained: the input is the draft's own decoder
output at the previous position (before its final norm) with the embedding of the token
it just proposed, one position further, attending to every earlier position (the TTT
attention pattern). Draft ids map to target ids through ``d2t`` (target = i + d2t[i]).

Two implementations of the same decoding: :class:`Target` and :class:`SpeculatorsDraft`
recompute the whole prefix for every verification and the draft re-reads it every round
(correctness first, the reference); :class:`CachedTarget` and :class:`CachedDraft` keep KV
caches for both (``validate.kv_cache``, the default), with identical tokens and counts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from eagle3_pipeline.core.config import ConfigError
from eagle3_pipeline.core.io import jsonl_objects
from eagle3_pipeline.serving.figures import acceptance_length
from eagle3_pipeline.validate.record import Divergence, OursFigures

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- prompts


@dataclass
class Prompt:
    id: str
    prompt_ids: list[int]


def load_prompts(path: str | Path, vocab_size: int | None = None) -> list[Prompt]:
    """``data/heldout/prompts.jsonl`` (the prepare stage): one object per line with ``id``
    and ``prompt_ids``. A bad row is a one-line error naming the file and the line."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: held-out prompts not found (run the prepare stage)")
    out: list[Prompt] = []
    for n, row in jsonl_objects(p, p.read_text(encoding="utf-8").splitlines()):
        ids = row.get("prompt_ids")
        if (
            not isinstance(ids, list)
            or not ids
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
        ):
            raise ConfigError(f"{p}:{n}: 'prompt_ids' must be a non-empty list of ints")
        if vocab_size is not None and not all(0 <= i < vocab_size for i in ids):
            raise ConfigError(
                f"{p}:{n}: 'prompt_ids' has ids outside the target vocabulary (size {vocab_size})"
            )
        out.append(Prompt(str(row.get("id", n)), ids))
    if not out:
        raise ConfigError(f"{p}: no prompts")
    return out


# --------------------------------------------------------------------------- the target


class Target:
    """The target's language model: logits and aux hidden states of a whole sequence.

    Aux states are captured exactly as the extract stage captures them
    (:class:`eagle3_pipeline.targets.capture.Capture`: forward pre-hooks on decoder layer k,
    i.e. the residual stream entering layer k = HF ``hidden_states[k]``).
    """

    def __init__(self, lm: Any, aux_layer_ids: Sequence[int]) -> None:
        from eagle3_pipeline.targets.capture import Capture

        self.lm = lm
        self.aux_layer_ids = list(aux_layer_ids)
        self.capture = Capture(lm, self.aux_layer_ids)
        self.forwards = 0

    @classmethod
    def load(
        cls, spec: Any, dtype: str = "float32", device: str = "cpu", gpu_count: int = 0
    ) -> Target:
        from eagle3_pipeline.targets.loading import load_language_model

        if not spec.path or not (Path(spec.path) / "config.json").is_file():
            raise FileNotFoundError(
                f"{spec.path}: the target directory (target.json 'path') has no config.json"
            )
        return cls(
            load_language_model(spec, Path(spec.path), dtype, device, gpu_count), spec.aux_layer_ids
        )

    @property
    def device(self) -> Any:
        return self.lm.device

    def states(self, ids: Sequence[int]) -> tuple[Any, Any]:
        """``(logits [T, V] float32, states [T, n_aux + 1, H])``: the aux layers' inputs
        and the final state before the norm, exactly the extract stage's file layout."""
        import torch

        self.forwards += 1
        x = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        with torch.no_grad():
            logits = self.lm.model(input_ids=x, use_cache=False).logits[0].float()
        return logits, self.capture.take()[0]

    def forward(self, ids: Sequence[int]) -> tuple[Any, Any]:
        """``(logits [T, V] float32, aux [T, n_aux * H])`` for one sequence."""
        logits, states = self.states(ids)
        # the order speculators' loader uses: hidden_states[:, :-1].flatten(1)
        return logits, states[:, :-1].flatten(1)

    def close(self) -> None:
        self.capture.remove()

    # The verifier interface speculative_decode and greedy_decode use; recomputing here,
    # with KV caches in CachedTarget (below).

    def start(self, prompt_ids: Sequence[int]) -> tuple[Any, Any]:
        """Prefill: ``(logits of the last position, aux of every prompt position)``."""
        logits, aux = self.forward(prompt_ids)
        return logits[-1], aux

    def verify(self, ctx: Sequence[int], drafts: Sequence[int]) -> tuple[Any, Any]:
        """One forward over ``ctx + drafts``: the logits at ``ctx``'s last position and at
        each draft (``[K + 1, V]``), and what :meth:`keep` needs of the aux states."""
        logits, aux_all = self.forward([*ctx, *drafts])
        return logits[len(ctx) - 1 :], aux_all

    def keep(self, ctx_len: int, accepted: int, aux: Any, verified: Any) -> Any:
        """After ``accepted`` drafts were kept: the aux states of every real token but the
        bonus one."""
        return verified[: ctx_len + accepted]


def top2_margin(logits_row: Any) -> float:
    """top-1 minus top-2 logit: how close greedy decoding was to a tie at that position."""
    import torch

    top = torch.topk(logits_row.float(), 2).values
    return float(top[0] - top[1])


@dataclass
class Greedy:
    tokens: list[int]
    margins: list[float]  # top-2 margin of the target's logits at each produced token


def greedy_decode(
    target: Any, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids: Iterable[int]
) -> Greedy:
    """The target's plain greedy decoding, one new position per forward: the reference
    :func:`greedy_check` is proven against, and ``measure(lossless_by="decode")``'s.
    ``target``: a :class:`Target` or a ``CachedTarget``."""
    stop = set(stop_ids)
    seq = list(prompt_ids)
    row, aux = target.start(seq)
    out: list[int] = []
    margins: list[float] = []
    while True:
        tok = int(row.argmax())
        out.append(tok)
        margins.append(top2_margin(row))
        if tok in stop or len(out) >= max_new_tokens:
            break
        ctx = seq + out
        rows, verified = target.verify(ctx, [])
        aux = target.keep(len(ctx), 0, aux, verified)
        row = rows[0]
    return Greedy(out, margins)


@dataclass
class GreedyCheck:
    lossless: bool
    first_divergence: int | None = None  # index into the produced tokens
    divergence_margin: float | None = None  # the target's top-2 margin there


def greedy_check(target: Target, prompt_ids: Sequence[int], tokens: Sequence[int]) -> GreedyCheck:
    """Whether ``tokens`` are the target's greedy continuation of ``prompt_ids``, in one
    teacher-forced forward over ``prompt + tokens[:-1]``.

    Why not decode the reference: plain greedy decoding costs one target forward per
    produced token, more than the speculative decoding it checks (about 60 % of the
    evaluator's time at 128 tokens). A sequence is the greedy one exactly when at every
    position the target's argmax over the same prefix is the token that follows, so one
    forward decides it; the first position where they differ is where decoding diverged,
    and the margin there is the one greedy decoding would have seen (same prefix). A
    sequence that stops early (a stop token) or at the length cap ends as greedy decoding
    would, since both stop on the same token at the same length."""
    if not tokens:
        return GreedyCheck(True)
    logits, _ = target.forward([*prompt_ids, *tokens[:-1]])
    target.forwards -= 1  # a check, not a verification
    rows = logits[len(prompt_ids) - 1 :]
    preds = rows.argmax(-1).tolist()
    for i, (pred, tok) in enumerate(zip(preds, tokens, strict=True)):
        if pred != tok:
            return GreedyCheck(False, i, top2_margin(rows[i]))
    return GreedyCheck(True)


def decode_check(
    target: Any,
    prompt_ids: Sequence[int],
    tokens: Sequence[int],
    max_new_tokens: int,
    stop_ids: Iterable[int],
) -> GreedyCheck:
    """The same verdict by decoding the reference (:func:`greedy_decode`)."""
    ref = greedy_decode(target, prompt_ids, max_new_tokens, stop_ids)
    if list(tokens) == ref.tokens:
        return GreedyCheck(True)
    pairs = zip(tokens, ref.tokens, strict=False)
    i = next((j for j, (a, b) in enumerate(pairs) if a != b), min(len(tokens), len(ref.tokens)))
    return GreedyCheck(False, i, ref.margins[i] if i < len(ref.margins) else None)


# --------------------------------------------------------------------------- drafts


class Proposer(Protocol):
    """What speculative decoding asks of a draft: K next tokens (target ids)."""

    def propose(self, tokens: Sequence[int], aux: Any, k: int) -> list[int]:
        """``tokens``: the sequence so far (prompt + produced); ``aux``: the target's aux
        states ``[len(tokens) - 1, n_aux * H]`` at every position but the last (the last
        token was produced by the target's previous forward and has not been run yet)."""
        ...


class SpeculatorsDraft:
    """A speculators ``Eagle3DraftModel`` proposing tokens the way EAGLE-3 serves it.

    Mirrors ``Eagle3DraftModel.forward`` (its modules, in its order) for inference: the
    same ``fc`` (+ optional ``input_norm`` / ``fc_norm``), the same concatenation of
    embeddings and hidden states, rotary positions that start at 1 for the first pair (as
    ``shift_batch`` leaves them), and the chained steps fed with the decoder's own output.
    """

    def __init__(self, model: Any, device: Any = "cpu", dtype: Any = None) -> None:
        import torch

        self.model = model.to(device=device, dtype=dtype or torch.float32).eval()
        self.device = torch.device(device)
        d2t = getattr(model, "d2t", None)
        self.d2t = d2t.to(self.device).long() if d2t is not None else None

    def _to_target(self, draft_id: Any) -> int:
        i = int(draft_id)
        return i + int(self.d2t[i]) if self.d2t is not None else i

    def _layers(self, x: Any, positions: Any, cache: Any, mask: Any) -> Any:
        m = self.model
        pos_emb = m.rotary_emb(x, positions)
        start = cache.get_seq_length()
        cache_position = torch_arange(start, start + x.shape[1], x.device)
        for layer in m.layers:
            x = layer(
                x,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                cache_position=cache_position,
                position_embeddings=pos_emb,
            )
        return x

    def _head(self, h: Any) -> tuple[Any, Any]:
        """(logits, the hidden state the next chained step is fed), as forward does: with
        ``norm_output`` the normed state is carried on, else the raw decoder output."""
        m = self.model
        if m.config.norm_output:
            h = m.norm(h)
            return m.lm_head(h), h
        return m.lm_head(m.norm(h)), h

    def pairs(self, tokens: Sequence[int], aux: Any, start: int) -> Any:
        """The draft's input for pairs ``start..len(tokens)-2``: ``fc`` of the aux states at
        t (after the optional norms) beside the embedding of token t+1 -- ``[1, n, 2H]``."""
        import torch

        m = self.model
        dtype = next(m.parameters()).dtype
        h = aux[start:].to(self.device, dtype).unsqueeze(0)
        if m.input_norm is not None:
            h = m.input_norm(h)
        if m.fc_norm is not None:
            chunks = h.chunk(len(m.fc_norm), dim=-1)
            h = torch.cat([nm(c) for nm, c in zip(m.fc_norm, chunks, strict=True)], dim=-1)
        ids = torch.tensor([list(tokens[start + 1 :])], dtype=torch.long, device=self.device)
        return torch.cat([m.embed_tokens(ids), m.fc(h)], dim=-1)

    def chain(self, out: Any, n: int, k: int, cache: Any) -> list[int]:
        """K proposals from the decoder output ``out`` at the last real pair: each chained
        step is fed the draft's own output and the token it just proposed, one position
        further (``n``: the number of real tokens)."""
        import torch

        m = self.model
        proposed: list[int] = []
        for step in range(k):
            logits, out = self._head(out)
            tok = self._to_target(logits[0, -1].argmax())
            proposed.append(tok)
            if step == k - 1:
                break
            emb = m.embed_tokens(torch.tensor([[tok]], device=self.device))
            x = torch.cat([emb, out], dim=-1)
            positions = torch.tensor([[n + step]], device=self.device)
            out = self._layers(x, positions, cache, None)
        return proposed

    def propose(self, tokens: Sequence[int], aux: Any, k: int) -> list[int]:
        import torch
        from transformers import DynamicCache

        n = len(tokens)
        if aux.shape[0] != n - 1:
            raise ValueError(f"aux has {aux.shape[0]} rows, expected {n - 1}")
        dtype = next(self.model.parameters()).dtype
        with torch.no_grad():
            x = self.pairs(tokens, aux, 0)
            positions = torch_arange(1, n, self.device).unsqueeze(0)
            causal = torch.full((n - 1, n - 1), float("-inf"), dtype=dtype, device=self.device)
            causal = torch.triu(causal, diagonal=1)[None, None]
            cache = DynamicCache()
            out = self._layers(x, positions, cache, causal)[:, -1:]
            return self.chain(out, n, k, cache)


def torch_arange(start: int, end: int, device: Any) -> Any:
    import torch

    return torch.arange(start, end, dtype=torch.long, device=device)


class OracleDraft:
    """Proposes the target's own greedy continuation (the upper bound: K+1 per step)."""

    def __init__(self, target: Target) -> None:
        self.target = target

    def propose(self, tokens: Sequence[int], aux: Any, k: int) -> list[int]:
        seq = list(tokens)
        out: list[int] = []
        for _ in range(k):
            logits, _ = self.target.forward(seq + out)
            self.target.forwards -= 1  # the oracle's forwards are not verifications
            out.append(int(logits[-1].argmax()))
        return out


# --------------------------------------------------------------------------- KV caches
#
# A target and a draft that speculative_decode drives exactly as the recomputing ones, with
# the same tokens and counts, without recomputing the prefix (``validate.kv_cache``).
#
# Why: the recomputing evaluator runs the target over the whole sequence at every
# verification and the draft over the whole prefix every round -- O(n^2) in generated
# length. Fine for the tiny target; prohibitive for an 8B target on one GPU, which users run
# before paying for vLLM time. Here:
#
# - the target keeps a KV cache of every token whose state is final. A verification feeds
#   only the last produced token and the K drafts (K + 1 positions), then crops the cache
#   back to the accepted prefix (rejected drafts roll back);
# - the draft keeps a KV cache of its prefix positions. A round feeds only the pairs that
#   are new since the last round, runs its K - 1 chained steps on top, then crops them away.
#
# The aux states the draft reads are kept from each verification's own forward (the same
# rows the recomputing evaluator slices from its full forward).


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
            logits = (
                t.lm.model(input_ids=x, past_key_values=self.cache, use_cache=True)
                .logits[0]
                .float()
            )
        return logits, t.capture.take()[0][:, :-1].flatten(1)

    # the verifier interface of Target

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
            mask[:, done:] = torch.triu(
                torch.full((new, new), float("-inf"), dtype=dtype, device=d.device), diagonal=1
            )
            out = d._layers(x, positions, self.cache, mask[None, None])[:, -1:]
            proposed = d.chain(out, n, k, self.cache)
            keep_first(self.cache, n - 1)  # the chain's entries are this round's only
        return proposed


# --------------------------------------------------------------------------- decoding


@dataclass
class PromptResult:
    id: str
    prompt_tokens: int
    tokens: list[int]  # produced after the prompt, the prefill's token first
    steps: int  # target verification forwards
    step_tokens: int  # tokens produced by those forwards (kept after truncation)
    accepted_per_pos: list[int]  # verification steps whose draft token i was accepted
    accepted: int  # draft tokens accepted, before truncation (vLLM's counter)
    lossless: bool | None = None
    first_divergence: int | None = None
    divergence_margin: float | None = None


def greedy_start(target: Any, prompt_ids: Sequence[int]) -> tuple[int, Any]:
    """The prefill's greedy token and the prompt's aux states. A verifier that already
    knows its tokens (``replay.Replay``) answers ``start_ids`` itself."""
    if hasattr(target, "start_ids"):
        return target.start_ids(prompt_ids)  # type: ignore[no-any-return]
    row, aux = target.start(prompt_ids)
    return int(row.argmax()), aux


def greedy_verify(target: Any, ctx: Sequence[int], drafts: Sequence[int]) -> tuple[list[int], Any]:
    """The target's greedy token after ``ctx`` and after each draft (K + 1 ids), and what
    ``keep`` needs; ``verify_ids`` where the verifier has it (as :func:`greedy_start`)."""
    if hasattr(target, "verify_ids"):
        return target.verify_ids(ctx, drafts)  # type: ignore[no-any-return]
    rows, verified = target.verify(ctx, drafts)
    return rows.argmax(-1).tolist(), verified


def speculative_decode(
    target: Any,
    draft: Proposer,
    prompt: Prompt,
    k: int,
    max_new_tokens: int,
    stop_ids: Iterable[int],
) -> PromptResult:
    """Chained greedy speculative decoding of one prompt. ``target``: a :class:`Target`
    (recomputes every prefix) or a ``CachedTarget`` (KV cache, rollback of rejected
    drafts); a draft with a ``reset`` method is reset for the prompt."""
    stop = set(stop_ids)
    seq = list(prompt.prompt_ids)
    if hasattr(draft, "reset"):
        draft.reset()
    first, aux = greedy_start(target, seq)  # prefill: not a verification
    out = [first]
    res = PromptResult(prompt.id, len(seq), out, 0, 0, [0] * k, 0)
    while len(out) < max_new_tokens and out[-1] not in stop:
        ctx = seq + out
        drafts = [int(t) for t in draft.propose(ctx, aux, k)]
        if len(drafts) != k:
            raise ValueError(f"the draft proposed {len(drafts)} tokens, expected {k}")
        preds, verified = greedy_verify(target, ctx, drafts)  # K + 1 target tokens
        a = 0
        while a < k and drafts[a] == preds[a]:
            res.accepted_per_pos[a] += 1
            a += 1
        res.accepted += a
        res.steps += 1
        aux = target.keep(len(ctx), a, aux, verified)
        for tok in drafts[:a] + [preds[a]]:
            if len(out) >= max_new_tokens:
                break
            out.append(tok)
            res.step_tokens += 1
            if tok in stop:
                break
    return res


@dataclass
class AcceptanceResult:
    k: int
    prompts: int
    max_new_tokens: int
    tokens: int  # all produced tokens (prefill tokens included)
    step_tokens: int
    steps: int
    accepted: int
    accepted_per_pos: list[int]
    acceptance_length: float | None  # step_tokens / steps
    vllm_style_acceptance_length: float | None  # 1 + accepted / steps (no end effects)
    per_position_rate: list[float | None]  # accepted at position i / steps (vLLM's)
    per_position_conditional: list[float | None]  # given position i-1 was accepted
    lossless: bool | None
    lossless_prompts: int
    divergences: list[Divergence] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def figures(self) -> OursFigures:
        """The figures a prompt set's slice reports (validate.record.OursFigures)."""
        return OursFigures(
            prompts=self.prompts,
            tokens=self.tokens,
            steps=self.steps,
            acceptance_length=self.acceptance_length,
            vllm_style_acceptance_length=self.vllm_style_acceptance_length,
            accepted_per_pos=self.accepted_per_pos,
            per_position_rate=self.per_position_rate,
            per_position_conditional=self.per_position_conditional,
        )


def pool(results: Sequence[PromptResult], k: int, max_new_tokens: int) -> AcceptanceResult:
    steps = sum(r.steps for r in results)
    step_tokens = sum(r.step_tokens for r in results)
    accepted = sum(r.accepted for r in results)
    per_pos = [sum(r.accepted_per_pos[i] for r in results) for i in range(k)]
    rate = [c / steps if steps else None for c in per_pos]
    cond: list[float | None] = []
    for i, c in enumerate(per_pos):
        prev = steps if i == 0 else per_pos[i - 1]
        cond.append(c / prev if prev else None)
    checked = [r for r in results if r.lossless is not None]
    return AcceptanceResult(
        k=k,
        prompts=len(results),
        max_new_tokens=max_new_tokens,
        tokens=sum(len(r.tokens) for r in results),
        step_tokens=step_tokens,
        steps=steps,
        accepted=accepted,
        accepted_per_pos=per_pos,
        acceptance_length=step_tokens / steps if steps else None,
        vllm_style_acceptance_length=acceptance_length(accepted, steps),
        per_position_rate=rate,
        per_position_conditional=cond,
        lossless=all(r.lossless for r in checked) if checked else None,
        lossless_prompts=sum(1 for r in checked if r.lossless),
        divergences=[
            Divergence(r.id, r.first_divergence, r.divergence_margin)
            for r in checked
            if not r.lossless
        ],
    )


def measure(
    target: Target,
    draft: Proposer,
    prompts: Sequence[Prompt],
    k: int,
    max_new_tokens: int,
    stop_ids: Iterable[int],
    check_lossless: bool = True,
    progress: bool = False,
    kv_cache: bool = False,
    lossless_by: Literal["forward", "decode"] = "forward",
) -> tuple[AcceptanceResult, list[PromptResult]]:
    """Speculative decoding of every prompt, each checked against the target's greedy
    decoding.

    ``kv_cache``: decode with KV caches (:class:`CachedTarget`, :class:`CachedDraft`; needs
    a :class:`SpeculatorsDraft`): the same tokens and counts without recomputing prefixes.
    ``lossless_by``: ``forward`` checks each answer in one teacher-forced target forward
    (:func:`greedy_check`); ``decode`` decodes the greedy reference token by token (the
    older, slower way, kept for ``bench/acceptance.py --lossless`` and the test that both
    give the same verdicts)."""
    if k < 1:
        raise ConfigError(f"K={k} must be >= 1")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens} must be >= 1")
    stop = list(stop_ids)
    results: list[PromptResult] = []
    it: Iterable[Prompt] = prompts
    if progress:
        from tqdm import tqdm

        it = tqdm(prompts, desc=f"speculative decoding (K={k})", unit="prompt")
    verifier: Any = target
    if kv_cache:
        if not isinstance(draft, SpeculatorsDraft):
            raise ConfigError(f"kv_cache needs a SpeculatorsDraft, not {type(draft).__name__}")
        verifier, draft = CachedTarget(target), CachedDraft(draft)
    for p in it:
        r = speculative_decode(verifier, draft, p, k, max_new_tokens, stop)
        if check_lossless:
            verdict = (
                greedy_check(target, p.prompt_ids, r.tokens)
                if lossless_by == "forward"
                else decode_check(verifier, p.prompt_ids, r.tokens, max_new_tokens, stop)
            )
            r.lossless = verdict.lossless
            r.first_divergence = verdict.first_divergence
            r.divergence_margin = verdict.divergence_margin
        results.append(r)
    return pool(results, k, max_new_tokens), results
