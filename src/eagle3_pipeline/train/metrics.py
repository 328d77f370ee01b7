"""Numbers of a run: per-step sums into loss and accuracies (the run's details are
built by :func:`eagle3_pipeline.train.run.run_record`).

speculators' forward returns ``*_sum`` / ``*_total`` counts rather than means, so that
packs of different sizes and several ranks add up exactly: they are summed over batches
and ranks first and divided once (:func:`summarize`).
"""

from __future__ import annotations

from typing import Any


def summarize(sums: dict[str, float], k: int) -> dict[str, Any]:
    """Loss and per-position accuracies from speculators' ``*_sum`` / ``*_total`` counts."""

    def ratio(name: str) -> float:
        tot = sums.get(f"{name}_total", 0.0)
        return sums.get(f"{name}_sum", 0.0) / tot if tot > 0 else 0.0

    return {
        "loss": ratio("loss"),
        "loss_per_position": [ratio(f"loss_{i}") for i in range(k)],
        "accuracy_per_position": [ratio(f"full_acc_{i}") for i in range(k)],
        "conditional_accuracy_per_position": [ratio(f"cond_acc_{i}") for i in range(k)],
    }


def accumulate(acc: dict[str, float], metrics: dict[str, Any]) -> None:
    """Add one forward's ``*_sum`` / ``*_total`` counts to ``acc``."""
    for key, value in metrics.items():
        if key.endswith(("_sum", "_total")):
            acc[key] = acc.get(key, 0.0) + float(value)
