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
from eagle3_pipeline.validate.vllm import acceptance_figures


def _ours(results: Sequence[PromptResult], k: int, max_new_tokens: int) -> dict[str, Any]:
    acc = pool(results, k, max_new_tokens)
    return {
        "prompts": acc.prompts,
        "tokens": acc.tokens,
        "steps": acc.steps,
        "acceptance_length": acc.acceptance_length,
        "vllm_style_acceptance_length": acc.vllm_style_acceptance_length,
        "accepted_per_pos": acc.accepted_per_pos,
        "per_position_rate": acc.per_position_rate,
        "per_position_conditional": acc.per_position_conditional,
    }


def _vllm(groups: dict[str, dict[str, Any]], labels: set[str]) -> dict[str, Any]:
    total: dict[str, Any] = {}
    for label in sorted(labels):
        total = add_counters(total, groups.get(label, {}))
    return acceptance_figures(total)


def _slice(
    prompts: Sequence[EvalPrompt],
    results: Sequence[PromptResult],
    keep: Any,
    k: int,
    max_new_tokens: int,
    groups: dict[str, dict[str, Any]] | None,
) -> dict[str, Any]:
    chosen = [(p, r) for p, r in zip(prompts, results, strict=True) if keep(p)]
    out: dict[str, Any] = {"ours": _ours([r for _, r in chosen], k, max_new_tokens)}
    if groups is not None:
        v = _vllm(groups, {p.group for p, _ in chosen})
        ours = out["ours"]["vllm_style_acceptance_length"]
        mean = v["mean_acceptance_length"]
        out["vllm"] = v
        out["acceptance_length_diff"] = None if ours is None or mean is None else mean - ours
    return out


def figures_by_set(
    prompts: Sequence[EvalPrompt],
    results: Sequence[PromptResult],
    k: int,
    max_new_tokens: int,
    group_counters: dict[str, dict[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """``{set: {description, questions, ours, vllm?, turns?, categories?}}`` in the order
    the sets were measured. ``group_counters``: vLLM's counters per label (None: no vLLM)."""
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(p.set for p in prompts):
        mine = [p for p in prompts if p.set == name]
        fig = {
            "description": DESCRIPTIONS.get(name, name),
            "questions": sum(1 for p in mine if p.turn == 1),
            **_slice(
                prompts, results, lambda p, n=name: p.set == n, k, max_new_tokens, group_counters
            ),
        }
        turns = sorted({p.turn for p in mine})
        if len(turns) > 1:
            fig["turns"] = {
                str(t): _slice(
                    prompts,
                    results,
                    lambda p, n=name, t=t: p.set == n and p.turn == t,
                    k,
                    max_new_tokens,
                    group_counters,
                )
                for t in turns
            }
        cats = sorted({p.category for p in mine if p.category})
        if cats:
            fig["categories"] = {
                c: _slice(
                    prompts,
                    results,
                    lambda p, n=name, c=c: p.set == n and p.category == c,
                    k,
                    max_new_tokens,
                    group_counters,
                )
                for c in cats
            }
        out[name] = fig
    return out


def vllm_by_set(
    prompts: Sequence[EvalPrompt], group_counters: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """vLLM's figures per prompt set from one pass's per-label counters (a sampled pass:
    no decoder of ours to set beside them)."""
    return {
        name: _vllm(group_counters, {p.group for p in prompts if p.set == name})
        for name in dict.fromkeys(p.set for p in prompts)
    }


def headline_by_set(sets: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Acceptance length per set: vLLM's counters' where vLLM ran, else ours (vLLM style,
    1 + accepted / drafts: the figure vLLM's CI publishes)."""
    out: dict[str, float | None] = {}
    for name, fig in sets.items():
        if "vllm" in fig:
            out[name] = fig["vllm"]["mean_acceptance_length"]
        else:
            out[name] = fig["ours"]["vllm_style_acceptance_length"]
    return out
