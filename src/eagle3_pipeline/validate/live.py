"""The validate stage's figures through dvclive: the summary DVC shows (acceptance length,
vLLM's acceptance and speedup, losslessness), per-position acceptance as a plot that
``dvc plots diff`` compares across experiments, and ``acceptance.png``.

Values are copied from the stage's metrics (``metrics/details/validate.json``), never
recomputed, so the summary and the details cannot disagree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3_pipeline.core.metrics import open_live
from eagle3_pipeline.validate.record import ValidateRecord


def write_live(directory: Path, record: ValidateRecord, png: bytes) -> dict[str, Any]:
    """Write dvclive's files for one validation; return the summary as written.

    The summary is the record's headline fields, the figures a user decides on
    (vllm_speedup needs validate.vllm=true; vLLM's own acceptance length and losslessness
    must agree with ours -- the stage fails otherwise -- and stay in the details with K
    and the per-position rates; with validate.k_sweep also the best K and its speedup)."""
    live = open_live(directory)
    for key, value in record.headline().items():
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            live.log_metric(key, value, plot=False)
        elif isinstance(value, bool):
            live.summary[key] = value  # dvclive logs numbers; a verdict stays a boolean
        elif isinstance(value, dict):  # per prompt set: acceptance_by_set/mt_bench
            for name, x in value.items():
                if isinstance(x, (int, float)) and not isinstance(x, bool):
                    live.log_metric(f"{key}/{name}", x, plot=False)
    # the evaluator's rates (vLLM's agree within validate.vllm_agreement_tol, checked by
    # the stage; both lists stay in the details)
    points = [
        {"position": i, "acceptance": rate} for i, rate in enumerate(record.ours.per_position_rate)
    ]
    live.log_plot(
        "acceptance_per_position",
        points,
        x="position",
        y="acceptance",
        template="linear",
        title="accepted at each draft position (share of steps)",
        x_label="draft position",
        y_label="acceptance rate",
    )
    image = directory / "acceptance.png.tmp"
    image.write_bytes(png)
    try:
        live.log_image("acceptance.png", image)
    finally:
        image.unlink(missing_ok=True)
    live.make_summary()
    return dict(live.summary)
