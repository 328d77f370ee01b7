"""vLLM's speculative-decoding counters: their names and the difference of two readings.

Standard library only: :mod:`eagle3_pipeline.serving.worker` imports it inside the vLLM
environment, :mod:`eagle3_pipeline.validate.vllm` in the training one. A reading is
``{"drafts", "draft_tokens", "accepted": int, "accepted_per_pos": [int]}``, or ``{}`` when
speculative decoding is off. Mean acceptance length = 1 + accepted / drafts.
"""

from __future__ import annotations

from typing import Any

COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def counter_delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The counters accumulated between two readings (they are cumulative per engine)."""
    if not after:
        return {}
    out = {k: after[k] - before.get(k, 0) for k in COUNTERS.values() if k in after}
    a, b = after.get("accepted_per_pos", []), before.get("accepted_per_pos", [])
    b = b + [0] * (len(a) - len(b))
    out["accepted_per_pos"] = [x - y for x, y in zip(a, b, strict=False)]
    return out
