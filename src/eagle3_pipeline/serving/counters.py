"""vLLM's speculative-decoding counters: their names and the difference of two readings.

Standard library only: :mod:`eagle3_pipeline.serving.worker` imports it inside the vLLM
environment, :mod:`eagle3_pipeline.validate.vllm` in the training one. A reading is
``{"drafts", "draft_tokens", "accepted": int, "accepted_per_pos": [int]}``, or ``{}`` when
speculative decoding is off. Mean acceptance length = 1 + accepted / drafts.
"""

from __future__ import annotations

from typing import Any

from eagle3_pipeline.serving.figures import tokens_per_s

COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def generation_run(
    outputs: list[list[int]],
    wall_s: float,
    after: dict[str, Any],
    before: dict[str, Any],
    **extra: Any,
) -> dict[str, Any]:
    """One measured generation pass, as both engines report it (the offline worker in the
    vLLM environment, the serve mode over HTTP): the token ids, tokens/s over ``wall_s``
    and the spec-decode counters accumulated during it, plus ``extra`` timings."""
    generated = sum(len(o) for o in outputs)
    return {
        "outputs": outputs,
        "generated_tokens": generated,
        "wall_s": wall_s,
        "tokens_per_s": tokens_per_s(generated, wall_s),
        "counters": counter_delta(after, before),
        **extra,
    }


def counter_delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The counters accumulated between two readings (they are cumulative per engine)."""
    if not after:
        return {}
    out = {k: after[k] - before.get(k, 0) for k in COUNTERS.values() if k in after}
    a, b = after.get("accepted_per_pos", []), before.get("accepted_per_pos", [])
    b = b + [0] * (len(a) - len(b))
    out["accepted_per_pos"] = [x - y for x, y in zip(a, b, strict=False)]
    return out


def add_counters(total: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """The sum of two counter differences (``{}`` is zero)."""
    if not total:
        return dict(more)
    if not more:
        return dict(total)
    out = {k: total.get(k, 0) + more.get(k, 0) for k in COUNTERS.values()}
    a, b = total.get("accepted_per_pos", []), more.get("accepted_per_pos", [])
    n = max(len(a), len(b))
    a, b = a + [0] * (n - len(a)), b + [0] * (n - len(b))
    out["accepted_per_pos"] = [x + y for x, y in zip(a, b, strict=True)]
    return out


def by_label(labels: list[str]) -> dict[str, list[int]]:
    """The prompt indices of each label, labels in order of first appearance: a counting
    pass runs one label's prompts at a time so vLLM's engine-wide counters are that
    label's (the offline worker and the served path alike)."""
    order: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        order.setdefault(label, []).append(i)
    return order
