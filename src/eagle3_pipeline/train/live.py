"""The run's curves through dvclive: step metrics (``train/loss``, ``train/acc_<i>``,
``train/lr``, ``train/tokens_per_s``), epoch metrics (``val/loss``, ``val/acc_<i>``) at the
optimizer step they were measured, the ``curves.png`` image, and the summary DVC shows.

Why dvclive: its per-metric TSV files under ``dvclive/train/plots/metrics/`` are appended
as training runs, so ``dvc exp run`` (and DVC's VS Code extension) shows live curves,
``dvc plots diff`` compares runs step by step, and the summary is ``dvc exp show``'s
column set -- with no plotting code of ours beyond the one PNG people look at first.

Resume: the curves of a killed run live in the resumable state (:class:`History`), not in
dvclive's files (a kill can land between the two). A resumed run starts dvclive afresh and
replays the history, so its files equal an uninterrupted run's, timestamps aside.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.metrics import open_live
from eagle3_pipeline.train.record import TrainRecord
from eagle3_pipeline.train.select import val_acceptance


@dataclass
class History:
    """Every curve point of the run so far; saved in the training state."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    epochs: list[dict[str, Any]] = field(default_factory=list)

    def log_step(
        self, step: int, epoch: int, summary: dict[str, Any], lr: float, tokens_per_s: float
    ) -> dict[str, Any]:
        """One optimizer step (``summary``: :func:`metrics.summarize` of its sums)."""
        row = {
            "step": step,
            "epoch": epoch,
            "loss": summary["loss"],
            **{f"acc_{i}": a for i, a in enumerate(summary["accuracy_per_position"])},
            "lr": lr,
            "tokens_per_s": tokens_per_s,
        }
        self.steps.append(row)
        return row

    def log_epoch(self, epoch: int, step: int, val: dict[str, Any]) -> dict[str, Any]:
        """The validation at the end of an epoch (or of the run)."""
        row = {
            "epoch": epoch,
            "step": step,
            "val_loss": val["loss"],
            "val_acceptance": val_acceptance(val["accuracy_per_position"]),
            **{f"val_acc_{i}": a for i, a in enumerate(val["accuracy_per_position"])},
        }
        self.epochs.append(row)
        return row


class LiveCurves:
    """dvclive for one training run on rank 0."""

    def __init__(self, directory: Path, history: History) -> None:
        self.directory = directory
        self.live = open_live(directory)
        by_step: dict[int, list[dict[str, Any]]] = {}
        for e in history.epochs:
            by_step.setdefault(e["step"], []).append(e)
        for row in history.steps:
            self.log_step(row, summary=False)
            for e in by_step.get(row["step"], []):
                self.log_epoch(e)

    def log_step(self, row: dict[str, Any], summary: bool = False) -> None:
        self.live.step = row["step"]
        for key, value in row.items():
            if key not in ("step", "epoch"):
                self.live.log_metric(f"train/{key}", value)
        if summary:
            self.summary()

    def log_epoch(self, row: dict[str, Any]) -> None:
        self.live.step = row["step"]
        for key, value in row.items():
            if key.startswith("val_"):
                self.live.log_metric(f"val/{key[4:]}", value)
        self.summary()

    def summary(self) -> None:
        """Write the summary DVC shows: the step and the last val loss. The rest (the last
        step's loss, accuracies, lr, tokens/s, the val accuracies) are curves; in the
        summary they would be columns of ``dvc metrics show`` and ``dvc exp show``."""
        self.live.summary.pop("train", None)
        val = self.live.summary.get("val")
        if isinstance(val, dict):
            self.live.summary["val"] = {"loss": val["loss"]} if "loss" in val else {}
        self.live.make_summary()

    def finish(self, history: History, k: int, val_loss: float | None = None) -> None:
        """The curves image and the summary; the stage adds its headline afterwards.
        ``val_loss``: the written draft's (train.select may have chosen an earlier epoch
        than the last curve point)."""
        import matplotlib.pyplot as plt

        fig = curves_figure(history, k)
        self.live.log_image("curves.png", fig)
        plt.close(fig)
        self.summary()
        if val_loss is not None:
            self.live.summary["val"] = {"loss": val_loss}
            self.live.make_summary()


def write_summary(directory: Path, record: TrainRecord) -> dict[str, Any]:
    """Add the record's headline fields to dvclive's summary, which carries the step and
    the last val loss already (values copied, never recomputed; see core/metrics.py for
    why the headline is this short), and return the summary as written."""
    live = open_live(directory, resume=True)
    for key, value in record.headline().items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            live.log_metric(key, value, plot=False)
    if isinstance(live.summary.get("step"), int):  # resume moved it one past the last step
        live.step = live.summary["step"]
    live.make_summary()
    return dict(live.summary)


def curves_figure(history: History, k: int) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_l, ax_a) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [r["step"] for r in history.steps]
    ax_l.plot(steps, [r["loss"] for r in history.steps], lw=0.8, label="train loss")
    if history.epochs:
        ax_l.plot(
            [r["step"] for r in history.epochs],
            [r["val_loss"] for r in history.epochs],
            "o-",
            label="val loss",
        )
    ax_l.set_xlabel("step")
    ax_l.set_ylabel("loss (sum over TTT steps)")
    ax_l.legend()
    for i in range(k):
        ax_a.plot(
            [r["step"] for r in history.epochs],
            [r[f"val_acc_{i}"] for r in history.epochs],
            "o-",
            label=f"val acc pos {i}",
        )
    ax_a.set_xlabel("step")
    ax_a.set_ylabel("accuracy (all positions <= i correct)")
    ax_a.set_ylim(0, 1)
    ax_a.legend()
    fig.tight_layout()
    return fig
