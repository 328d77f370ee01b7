"""Which epoch's draft is written (train.select) and when a run stops early
(train.patience): the rules, on figures stated here."""

from __future__ import annotations

import pytest

from eagle3_pipeline.core.choices import CheckpointMeasure
from eagle3_pipeline.train.select import Selection, candidate, val_acceptance


def _val(loss: float, acc: list[float]) -> dict[str, object]:
    return {"loss": loss, "accuracy_per_position": acc}


# (val loss, per-position accuracy) per epoch: acceptance peaks at epoch 1 (1.9), the
# loss keeps falling until epoch 2 -- the two measures disagree, as on a real overfit
EPOCHS = [
    (3.0, [0.5, 0.2, 0.1]),  # acceptance 1.8
    (2.5, [0.6, 0.2, 0.1]),  # 1.9
    (2.4, [0.5, 0.25, 0.1]),  # 1.85
    (2.6, [0.5, 0.2, 0.05]),  # 1.75
]


def _run(measure: CheckpointMeasure, patience: int | None = None) -> Selection:
    sel = Selection(str(measure), patience)
    for epoch, (loss, acc) in enumerate(EPOCHS):
        sel.offer(candidate(epoch, 10 * (epoch + 1), _val(loss, acc)), _val(loss, acc))
        if sel.out_of_patience():
            sel.stopped_early = True
            break
    return sel


def test_val_acceptance_is_one_plus_the_summed_accuracies() -> None:
    # each accuracy: all draft tokens up to that position correct, so their sum is the
    # expected number of draft tokens accepted per verification
    assert val_acceptance([0.5, 0.25, 0.125]) == pytest.approx(1.875)
    assert val_acceptance([]) == 1.0


@pytest.mark.parametrize(
    ("measure", "epoch"),
    [
        (CheckpointMeasure.val_acceptance, 1),
        (CheckpointMeasure.val_loss, 2),
        (CheckpointMeasure.last, 3),
    ],
)
def test_each_measure_chooses_its_own_best_epoch(measure: CheckpointMeasure, epoch: int) -> None:
    choice = _run(measure).choice()
    assert choice is not None
    assert choice.measure == str(measure)
    assert (choice.chosen_epoch, choice.chosen_step) == (epoch, 10 * (epoch + 1))
    assert [c.epoch for c in choice.candidates] == [0, 1, 2, 3]
    assert [c.val_loss for c in choice.candidates] == [e[0] for e in EPOCHS]
    assert not choice.stopped_early


def test_a_tie_keeps_the_earlier_epoch() -> None:
    sel = Selection(str(CheckpointMeasure.val_acceptance), None)
    for epoch in range(3):
        sel.offer(candidate(epoch, epoch, _val(1.0, [0.5, 0.2])), _val(1.0, [0.5, 0.2]))
    assert sel.best == 0 and not sel.is_last_best()


def test_patience_stops_after_that_many_epochs_without_a_better_draft() -> None:
    sel = _run(CheckpointMeasure.val_acceptance, patience=2)
    choice = sel.choice()
    assert choice is not None and choice.stopped_early
    # best at epoch 1; epochs 2 and 3 no better: stops after epoch 3
    assert [c.epoch for c in choice.candidates] == [0, 1, 2, 3]
    assert choice.chosen_epoch == 1 and choice.patience == 2
    sel = _run(CheckpointMeasure.val_acceptance, patience=1)
    assert [c.epoch for c in sel.candidates] == [0, 1, 2]
    # 'last' has no better or worse: patience never stops it
    sel = _run(CheckpointMeasure.last, patience=1)
    assert len(sel.candidates) == 4 and not sel.stopped_early


def test_the_state_round_trip_keeps_the_best_weights_and_figures() -> None:
    import torch

    sel = _run(CheckpointMeasure.val_acceptance)
    sel.best_weights = {"w": torch.ones(2)}
    again = Selection(str(CheckpointMeasure.val_acceptance), None)
    again.restore(sel.state())
    assert again.candidates == sel.candidates and again.best == 1
    assert again.best_val == _val(*EPOCHS[1])
    assert torch.equal(again.best_weights["w"], torch.ones(2))
    # a state written before the choice existed restores to no candidates
    empty = Selection(str(CheckpointMeasure.val_acceptance), None)
    empty.restore({})
    assert empty.choice() is None
