"""The train stage's own failures. Both are :class:`StageError`s, so the stage runner and
the torchrun worker show them as one ``error: train: ...`` line, not a traceback."""

from __future__ import annotations

from eagle3_pipeline.core.errors import StageError


class TrainingError(StageError):
    """Bad training input or a refused setting; the message names the file or key."""


class SimulatedFailure(StageError):
    """The test-only fault ``EAGLE3_FAULT_TRAIN_FAIL_AFTER_STEPS`` (tests of resume)."""
