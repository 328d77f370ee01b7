"""Which epoch's draft the train stage writes (``train.select``), and when it stops early
(``train.patience``).

Why not the last epoch's: a draft trained on little data overfits, and its acceptance
peaks after a few epochs and then falls (DeepSpec users report 3.34 at the peak and 3.18
by epoch 10 on Qwen3-4B), so ``train.epochs`` is the most epochs tried and each epoch's
validation decides. The default measure, ``val_acceptance``, is 1 + the sum over draft
positions of the share of held-out tokens whose draft tokens up to that position are all
the target's argmax: the acceptance length greedy speculative decoding would see on those
rows (speculators' EAL is the same sum without the 1). ``bench/selection.py`` serves
every epoch's draft in vLLM and compares its ranking with this one's.

The best draft's trainable weights are held on rank 0 (a CPU copy) and saved in the
resumable state, so a killed run resumes with its best candidate and its history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eagle3_pipeline.core.choices import CheckpointMeasure
from eagle3_pipeline.train.record import CheckpointChoice, EpochCandidate


def val_acceptance(accuracy_per_position: list[float]) -> float:
    """1 + the summed per-position accuracies (each: all draft tokens up to i correct)."""
    return 1.0 + float(sum(accuracy_per_position))


def candidate(epoch: int, step: int, val: dict[str, Any]) -> EpochCandidate:
    """One validated epoch (``val``: :func:`eagle3_pipeline.train.metrics.summarize`)."""
    acc = [float(a) for a in val["accuracy_per_position"]]
    return EpochCandidate(
        epoch=epoch,
        step=step,
        val_loss=float(val["loss"]),
        val_acceptance=val_acceptance(acc),
        val_accuracy_per_position=acc,
    )


def better(measure: CheckpointMeasure | str, new: EpochCandidate, best: EpochCandidate) -> bool:
    """Whether ``new`` beats ``best`` (a tie keeps the earlier: fewer steps, same figure)."""
    if measure == CheckpointMeasure.val_acceptance:
        return new.val_acceptance > best.val_acceptance
    if measure == CheckpointMeasure.val_loss:
        return new.val_loss < best.val_loss
    return True  # last: every later epoch replaces the one before


@dataclass
class Selection:
    """The candidates so far and the best one's weights (rank 0; empty elsewhere under
    FSDP, where the gather leaves the other ranks nothing)."""

    measure: str
    patience: int | None
    candidates: list[EpochCandidate] = field(default_factory=list)
    best: int | None = None  # index into candidates
    best_val: dict[str, Any] | None = None  # the best epoch's full validation summary
    best_weights: dict[str, Any] = field(default_factory=dict)
    stopped_early: bool = False

    def offer(self, cand: EpochCandidate, val: dict[str, Any]) -> bool:
        """Record ``cand``; True if it is the new best (its weights are to be kept)."""
        self.candidates.append(cand)
        if self.best is None or better(self.measure, cand, self.candidates[self.best]):
            self.best = len(self.candidates) - 1
            self.best_val = val
            return True
        return False

    def out_of_patience(self) -> bool:
        """``patience`` epochs in a row without a better draft (never for ``last``)."""
        if self.patience is None or self.best is None or self.measure == CheckpointMeasure.last:
            return False
        return len(self.candidates) - 1 - self.best >= self.patience

    def is_last_best(self) -> bool:
        return self.best is not None and self.best == len(self.candidates) - 1

    def choice(self) -> CheckpointChoice | None:
        """The record's account of the choice (None before any epoch was validated)."""
        if self.best is None:
            return None
        chosen = self.candidates[self.best]
        return CheckpointChoice(
            measure=str(self.measure),
            chosen_epoch=chosen.epoch,
            chosen_step=chosen.step,
            candidates=list(self.candidates),
            stopped_early=self.stopped_early,
            patience=self.patience,
        )

    # -- the resumable state: plain values, loadable whatever becomes of these classes

    def state(self) -> dict[str, Any]:
        return {
            "candidates": [c.__dict__ for c in self.candidates],
            "best": self.best,
            "best_val": self.best_val,
            "best_weights": self.best_weights,
            "stopped_early": self.stopped_early,
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.candidates = [EpochCandidate(**c) for c in state.get("candidates", [])]
        self.best = state.get("best")
        self.best_val = state.get("best_val")
        self.best_weights = state.get("best_weights") or {}
        self.stopped_early = bool(state.get("stopped_early", False))
