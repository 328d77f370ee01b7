"""Which rows are forwarded together, and which rank forwards them.

The plan is a pure function of the row lengths: resume works by whole batches, so a
rerun must cut exactly the batches the interrupted run did (same padding, so
bitwise-equal files).
"""

from __future__ import annotations

from collections.abc import Sequence

from eagle3_pipeline.core.config import ConfigError


def plan_batches(lengths: Sequence[int], batch_tokens: int, plan_rows: int) -> list[list[int]]:
    """Length-bucketed batches, padding-aware: ``len(batch) * longest row <= batch_tokens``
    (a row longer than the budget is a batch of its own).

    A pure function of the row lengths, so a resumed run processes exactly the batches
    the interrupted one did (same padding, bitwise-equal files). Rows are sorted within
    consecutive segments of ``plan_rows`` rows, so appending rows (train.samples N -> M)
    leaves every batch of the earlier full segments unchanged."""
    if batch_tokens < 1 or plan_rows < 1:
        raise ConfigError("extract.batch_tokens and extract.plan_rows must be >= 1")
    batches: list[list[int]] = []
    n = len(lengths)
    for seg in range(0, n, plan_rows):
        order = sorted(range(seg, min(n, seg + plan_rows)), key=lambda i: (-lengths[i], i))
        cur: list[int] = []
        longest = 0
        for i in order:
            grown = max(longest, lengths[i])
            if cur and grown * (len(cur) + 1) > batch_tokens:
                batches.append(cur)
                cur, grown = [], lengths[i]
            cur.append(i)
            longest = grown
        if cur:
            batches.append(cur)
    return batches


def rank_batches(plan: list[list[int]], rank: int, world_size: int) -> list[tuple[int, list[int]]]:
    """This process's share: batches ``j % world_size == rank`` (round robin, so every
    rank gets long and short batches alike)."""
    return [(j, b) for j, b in enumerate(plan) if j % world_size == rank]
