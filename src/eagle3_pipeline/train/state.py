"""Resume: ``data/train_state/state.pt`` (DVC ``persist``) holds the trainable weights,
optimizer, scheduler, step, RNG states, curves and a fingerprint of everything that shapes
the run (:func:`eagle3_pipeline.train.plan.fingerprint`); ``state.json`` repeats the
position for people and tests.

A state whose fingerprint differs, or that finished, is ignored: a ``persist`` directory
left by other params must not be resumed silently. speculators' ``Trainer`` checkpoints
per epoch without RNG state or fingerprint, one reason this loop is our own.

Under FSDP the state is gathered into a full state dict on rank 0 (a collective: every
rank takes part, rank 0 writes), and on resume every rank reads the full file and keeps
its shard.
"""

from __future__ import annotations

import io
import logging
import random
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from eagle3_pipeline.core.io import atomic_write_bytes, atomic_write_json
from eagle3_pipeline.train.live import History
from eagle3_pipeline.train.record import EpochSharding

if TYPE_CHECKING:
    from eagle3_pipeline.train.distributed import Dist
    from eagle3_pipeline.train.plan import TrainPlan
    from eagle3_pipeline.train.select import Selection

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"
EPOCH_DRAFTS = "epochs"  # train.keep_epoch_drafts: each epoch's draft, under the state dir
SUMMARY_FILE = "state.json"
_SUMMARY_KEYS = ("fingerprint", "global_step", "epoch", "step_in_epoch", "total_steps", "finished")


class Resumable(Protocol):
    """What resume saves and restores of a run: the parts of
    :class:`~eagle3_pipeline.train.loop.DraftTrainer` it reads and sets (stated here, not
    imported: the loop imports this module)."""

    plan: TrainPlan
    d: Dist
    parallel: str
    model: Any
    optimizer: Any
    scheduler: Any
    global_step: int
    total_steps: int
    history: History
    sharding: list[EpochSharding]
    val_untrained: dict[str, Any] | None
    val_loss_untrained: float | None
    selection: Selection


def full_state_dict(model: Any, parallel: str) -> dict[str, Any]:
    """The draft's full state dict on CPU. Under FSDP a collective: every rank must
    call it; rank 0 gets the gathered tensors, the others an empty dict."""
    if parallel != "fsdp":
        return {n: t.detach().cpu() for n, t in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )


def trainable_state(model: Any, parallel: str) -> dict[str, Any]:
    """The trainable tensors of :func:`full_state_dict` (on CPU: the live parameters
    themselves, so a caller that keeps them copies them)."""
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {n: t for n, t in full_state_dict(model, parallel).items() if n in names}


def _optimizer_state(model: Any, optimizer: Any, parallel: str) -> dict[str, Any]:
    """Under FSDP the full (unsharded, FQN-keyed) optimizer state, gathered on rank 0."""
    if parallel != "fsdp":
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    return get_optimizer_state_dict(
        model,
        optimizer.optimizers,
        options=StateDictOptions(full_state_dict=True, cpu_offload=True),
    )


def save_state(tr: Resumable, epoch: int, step_in_epoch: int, finished: bool = False) -> None:
    """Write the position ``(epoch, step_in_epoch)`` to resume from (rank 0 writes)."""
    import numpy as np
    import torch

    if tr.parallel != "fsdp" and not tr.d.main:
        return
    # under FSDP these gather: every rank takes part, rank 0 writes
    model_state = trainable_state(tr.model, tr.parallel)
    optim_state = _optimizer_state(tr.model, tr.optimizer, tr.parallel)
    if not tr.d.main:
        return
    state = {
        "fingerprint": tr.plan.fingerprint,
        "global_step": tr.global_step,
        "epoch": epoch,
        "step_in_epoch": step_in_epoch,
        "total_steps": tr.total_steps,
        "finished": finished,
        "model": model_state,
        "optimizer": optim_state,
        "scheduler": tr.scheduler.state_dict(),
        "rng": {
            "torch": torch.get_rng_state(),
            "numpy": np.random.get_state(),
            "python": random.getstate(),
        },
        "history": asdict(tr.history),
        # plain dicts: a state stays loadable whatever becomes of the record's class
        "sharding": [asdict(s) for s in tr.sharding],
        "val_untrained": tr.val_untrained,
        # the epochs' figures and the best one's weights (train.select)
        "selection": tr.selection.state(),
    }
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(tr.plan.paths.state / STATE_FILE, buf.getvalue())
    atomic_write_json(tr.plan.paths.state / SUMMARY_FILE, {k: state[k] for k in _SUMMARY_KEYS})


def _read_state(path: Path, fingerprint: str, trainable: set[str]) -> dict[str, Any] | None:
    """The saved state if it continues this run, else None (with the reason logged)."""
    import torch

    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a corrupt file must not block a fresh run
        log.warning("%s: unreadable (%s); training from scratch", path, exc)
        return None
    if state.get("fingerprint") != fingerprint:
        log.info("%s: from other settings; training from scratch", path)
        return None
    if state.get("finished"):
        log.info("%s: a finished run; training again from scratch", path)
        return None
    if trainable - set(state["model"]):  # the same verdict on every rank (same file)
        log.warning("%s: weights missing; training from scratch", path)
        return None
    return state


def _restore_weights(tr: Resumable, state: dict[str, Any]) -> None:
    if tr.parallel == "fsdp":  # every rank read the full state: each keeps its shard
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, strict=False)
        set_model_state_dict(tr.model, state["model"], options=opts)
        set_optimizer_state_dict(
            tr.model,
            tr.optimizer.optimizers,
            state["optimizer"],
            options=StateDictOptions(full_state_dict=True),
        )
    else:
        tr.model.load_state_dict(state["model"], strict=False)
        tr.optimizer.load_state_dict(state["optimizer"])


def load_state(tr: Resumable) -> tuple[int, int] | None:
    """Restore a matching unfinished state into ``tr``; its resume position
    ``(epoch, step_in_epoch)``, or None to train from scratch."""
    import numpy as np
    import torch

    path = tr.plan.paths.state / STATE_FILE
    trainable = {n for n, p in tr.model.named_parameters() if p.requires_grad}
    state = _read_state(path, tr.plan.fingerprint, trainable)
    if state is None:
        return None
    _restore_weights(tr, state)
    tr.scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"]["torch"])
    np.random.set_state(state["rng"]["numpy"])
    random.setstate(state["rng"]["python"])
    tr.global_step = int(state["global_step"])
    tr.history = History(**state["history"])
    tr.sharding = [EpochSharding(**s) for s in state.get("sharding", [])]
    tr.val_untrained = state.get("val_untrained")
    tr.val_loss_untrained = (tr.val_untrained or {}).get("loss")
    tr.selection.restore(state.get("selection") or {})
    log.info(
        "resuming from %s at step %d (epoch %d, step %d of it)",
        path,
        tr.global_step,
        state["epoch"],
        state["step_in_epoch"],
    )
    return int(state["epoch"]), int(state["step_in_epoch"])
