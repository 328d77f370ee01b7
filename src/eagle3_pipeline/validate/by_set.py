"""Figures per prompt set, per MT-Bench category and per turn, from ours and vLLM's.

Why from one pass and not one engine per set: an engine start costs more than a set's
decoding on a CPU, and one pass gives every breakdown at once. Our evaluator keeps each
prompt's counts (:class:`~eagle3_pipeline.validate.acceptance.PromptResult`); vLLM's
counters are read per label (``set/category/turn``, see the worker's ``labels``) and
summed here the same way, so each set's vLLM acceptance length is its own counters', and
float32 agreement with ours is checked set by set.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eagle3_pipeline.serving.counters import add_counters
from eagle3_pipeline.validate.acceptance import PromptResult, pool
from eagle3_pipeline.validate.prompt_sets import DESCRIPTIONS, EvalPrompt
from eagle3_pipeline.validate.record import OursFigures, SetFigures, SliceFigures, VllmAcceptance
from eagle3_pipeline.validate.vllm import acceptance_figures


def _vllm(groups: dict[str, dict[str, Any]], labels: set[str]) -> VllmAcceptance:
    total: dict[str, Any] = {}
    for label in sorted(labels):
        total = add_counters(total, groups.get(label, {}))
    return acceptance_figures(total)


def _diff(vllm: VllmAcceptance | None, ours: OursFigures) -> float | None:
    if vllm is None or vllm.mean_acceptance_length is None:
        return None
    mine = ours.vllm_style_acceptance_length
    return None if mine is None else vllm.mean_acceptance_length - mine


def _slice(
    chosen: Sequence[tuple[EvalPrompt, PromptResult]],
    k: int,
    max_new_tokens: int,
    groups: dict[str, dict[str, Any]] | None,
) -> SliceFigures:
    ours = pool([r for _, r in chosen], k, max_new_tokens).figures()
    if groups is None:
        return SliceFigures(ours=ours)
    v = _vllm(groups, {p.group for p, _ in chosen})
    return SliceFigures(ours=ours, vllm=v, acceptance_length_diff=_diff(v, ours))


def figures_by_set(
    prompts: Sequence[EvalPrompt],
    results: Sequence[PromptResult],
    k: int,
    max_new_tokens: int,
    group_counters: dict[str, dict[str, Any]] | None = None,
) -> dict[str, SetFigures]:
    """Each set's figures (with per-turn and per-category slices) in the order the sets
    were measured. ``group_counters``: vLLM's counters per label (None: no vLLM)."""
    pairs = list(zip(prompts, results, strict=True))
    out: dict[str, SetFigures] = {}
    for name in dict.fromkeys(p.set for p in prompts):
        mine = [(p, r) for p, r in pairs if p.set == name]
        whole = _slice(mine, k, max_new_tokens, group_counters)
        turns = sorted({p.turn for p, _ in mine})
        cats = sorted({p.category for p, _ in mine if p.category})
        out[name] = SetFigures(
            description=DESCRIPTIONS.get(name, name),
            questions=sum(1 for p, _ in mine if p.turn == 1),
            ours=whole.ours,
            vllm=whole.vllm,
            acceptance_length_diff=whole.acceptance_length_diff,
            turns=(
                {
                    str(t): _slice(
                        [(p, r) for p, r in mine if p.turn == t], k, max_new_tokens, group_counters
                    )
                    for t in turns
                }
                if len(turns) > 1
                else None
            ),
            categories=(
                {
                    c: _slice(
                        [(p, r) for p, r in mine if p.category == c],
                        k,
                        max_new_tokens,
                        group_counters,
                    )
                    for c in cats
                }
                if cats
                else None
            ),
        )
    return out


def vllm_by_set(
    prompts: Sequence[EvalPrompt], group_counters: dict[str, dict[str, Any]]
) -> dict[str, VllmAcceptance]:
    """vLLM's figures per prompt set from one pass's per-label counters (a sampled pass:
    no decoder of ours to set beside them)."""
    return {
        name: _vllm(group_counters, {p.group for p in prompts if p.set == name})
        for name in dict.fromkeys(p.set for p in prompts)
    }


def headline_by_set(sets: dict[str, SetFigures]) -> dict[str, float | None]:
    """Acceptance length per set: vLLM's counters' where vLLM ran, else ours (vLLM style,
    1 + accepted / drafts: the figure vLLM's CI publishes)."""
    return {name: fig.acceptance() for name, fig in sets.items()}
