"""The formulas of the figures a draft is judged by, each written once.

Standard library only, like :mod:`eagle3_pipeline.serving.counters`: the vLLM workers use
:func:`tokens_per_s` inside the vLLM environment, validation the rest in the training one.
Why one home: our evaluator, vLLM's counters, the K and concurrency sweeps and the tests
all compute these; a second copy of a formula is a second definition that can drift.
"""

from __future__ import annotations

from collections.abc import Sequence


def acceptance_length(accepted: int, drafts: int) -> float | None:
    """Mean acceptance length as vLLM defines it: tokens per verification step, the
    target's own token plus the accepted draft tokens (1 + accepted / drafts); None
    without a draft round."""
    return 1 + accepted / drafts if drafts else None


def position_rates(accepted_per_pos: Sequence[int], drafts: int) -> list[float]:
    """Per draft position, the share of verification steps that accepted it; ``[]``
    without a draft round."""
    return [x / drafts for x in accepted_per_pos] if drafts else []


def tokens_per_s(tokens: int, wall_s: float) -> float | None:
    """Generated tokens over the generation pass's wall time; None for an empty pass."""
    return tokens / wall_s if wall_s > 0 else None


def speedup(with_draft: float | None, without_draft: float | None) -> float | None:
    """Tokens/s with the draft over tokens/s without it on the same prompts; None when
    either is unknown."""
    return with_draft / without_draft if with_draft and without_draft else None
