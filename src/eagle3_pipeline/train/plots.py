"""The run's curves: one row per optimizer step and one per epoch, kept in the resumable
state (a resumed run's curves continue the killed run's) and written to
``plots/train/steps.tsv`` / ``epochs.tsv`` (for ``dvc plots``) and ``curves.png``.

Everything about how curves are recorded and rendered lives here, so that another logger
can replace these files in one place.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.io import atomic_write_bytes, atomic_write_text


@dataclass
class History:
    steps: list[dict[str, Any]] = field(default_factory=list)
    epochs: list[dict[str, Any]] = field(default_factory=list)

    def log_step(self, step: int, epoch: int, summary: dict[str, Any], lr: float,
                 tokens_per_s: float) -> None:
        """One optimizer step (``summary``: :func:`metrics.summarize` of its sums)."""
        self.steps.append({
            "step": step, "epoch": epoch, "loss": summary["loss"],
            **{f"acc_{i}": a for i, a in enumerate(summary["accuracy_per_position"])},
            "lr": lr, "tokens_per_s": tokens_per_s,
        })

    def log_epoch(self, epoch: int, step: int, val: dict[str, Any]) -> None:
        """The validation at the end of an epoch (or of the run)."""
        self.epochs.append({
            "epoch": epoch, "step": step, "val_loss": val["loss"],
            **{f"val_acc_{i}": a for i, a in enumerate(val["accuracy_per_position"])},
        })


def write_plots(history: History, plots: Path, k: int) -> None:
    """``steps.tsv`` / ``epochs.tsv`` for ``dvc plots`` and ``curves.png`` for everyone."""
    step_cols = ["step", "epoch", "loss", *[f"acc_{i}" for i in range(k)], "lr", "tokens_per_s"]
    epoch_cols = ["epoch", "step", "val_loss", *[f"val_acc_{i}" for i in range(k)]]
    for name, cols, rows in (("steps.tsv", step_cols, history.steps),
                             ("epochs.tsv", epoch_cols, history.epochs)):
        lines = ["\t".join(cols)] + ["\t".join(f"{r.get(c, '')}" for c in cols) for r in rows]
        atomic_write_text(plots / name, "\n".join(lines) + "\n")
    atomic_write_bytes(plots / "curves.png", _curves_png(history, k))


def _curves_png(history: History, k: int) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_l, ax_a) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [r["step"] for r in history.steps]
    ax_l.plot(steps, [r["loss"] for r in history.steps], lw=0.8, label="train loss")
    if history.epochs:
        ax_l.plot([r["step"] for r in history.epochs], [r["val_loss"] for r in history.epochs],
                  "o-", label="val loss")
    ax_l.set_xlabel("step")
    ax_l.set_ylabel("loss (sum over TTT steps)")
    ax_l.legend()
    for i in range(k):
        ax_a.plot([r["step"] for r in history.epochs],
                  [r[f"val_acc_{i}"] for r in history.epochs], "o-", label=f"val acc pos {i}")
    ax_a.set_xlabel("step")
    ax_a.set_ylabel("accuracy (all positions <= i correct)")
    ax_a.set_ylim(0, 1)
    ax_a.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
