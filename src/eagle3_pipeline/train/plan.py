"""Everything a training run is decided by, checked before any process starts.

The stage plans before it launches torchrun, so that a refused setting or a bad input is
one line from the stage instead of N tracebacks from N workers; each worker plans again
(cheap: no tensors are read) and gets the same answer.

Why the plan carries the settings the run reads (``train``, ``seed``, the recipe and the
names the record keeps): a parameter goes one way through a process -- plan, then run
(:mod:`~eagle3_pipeline.train.run`, :class:`~eagle3_pipeline.train.loop.DraftTrainer`),
then record -- and nothing after the plan goes back to the stage's input view.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from eagle3_pipeline.core.config import TrainConfig, norm_before_fc_on
from eagle3_pipeline.draft.shape import DraftShape, check_train_config, special_token_ids
from eagle3_pipeline.targets.adapter import TargetSpec, load_target_spec
from eagle3_pipeline.train.errors import TrainingError
from eagle3_pipeline.train.inputs import check_hidden_states, count_rows, target_model_dir
from eagle3_pipeline.train.online import OnlineSource
from eagle3_pipeline.train.record import TrainRecipe
from eagle3_pipeline.train.runtime import Runtime, choose_parallel, resolve_runtime
from eagle3_pipeline.train.view import TrainInputs
from eagle3_pipeline.train.warm_start import (
    InitSource,
    check_compatible,
    describe,
    run_layout,
    source_layout,
    speculators_dir,
)


@dataclass(frozen=True)
class TrainPaths:
    target_json: Path
    prepared: Path
    hidden_states: Path
    draft: Path
    state: Path
    live: Path  # dvclive's directory for this stage

    @classmethod
    def from_config(cls, cfg: TrainInputs) -> TrainPaths:
        paths = cfg.paths
        return cls(
            target_json=Path(paths.target) / "target.json",
            prepared=Path(paths.prepared),
            hidden_states=Path(paths.hidden_states),
            draft=Path(paths.draft),
            state=Path(paths.train_state),
            live=Path(paths.live) / "train",
        )


@dataclass
class TrainPlan:
    """Everything checked before any training starts (the stage checks it before launching)."""

    train: TrainConfig  # the run's settings (``train.*``)
    seed: int  # the seed of the model's initialisation and of the batches' order
    target: str  # model.name, recorded in the details
    hardware: str  # hardware.name, recorded in the details
    recipe: TrainRecipe  # the optimisation recipe as the details record it
    spec: TargetSpec
    shape: DraftShape
    runtime: Runtime
    paths: TrainPaths
    n_rows: int
    required_tokens: dict[str, int]
    fingerprint: str
    parallel_reason: str = "one process"
    online: OnlineSource | None = None  # extract.mode=online: the server to start
    init: InitSource | None = None  # train.init_from, checked against this run
    init_dir: Path | None = None  # the source as our reload reads it (converted if need be)


def plan_training(cfg: TrainInputs, paths: TrainPaths | None = None) -> TrainPlan:
    """Check the config and every input; :class:`TrainingError` or ``ConfigError`` names
    the first problem."""
    paths = paths or TrainPaths.from_config(cfg)
    spec = load_target_spec(paths.target_json)
    shape = check_train_config(cfg.train, spec)
    runtime = resolve_runtime(cfg)
    mode, reason = choose_parallel(cfg, shape, spec, runtime.world_size * runtime.nodes)
    runtime = replace(runtime, parallel=mode)
    tdir = target_model_dir(spec)
    n_rows = count_rows(paths.prepared)
    n_val = n_rows - int(n_rows * (1 - cfg.train.val_fraction))
    if n_val < 1 or n_rows - n_val < 1:
        raise TrainingError(
            f"{paths.prepared}: {n_rows} rows cannot be split with "
            f"train.val_fraction={cfg.train.val_fraction}"
        )
    manifest = check_hidden_states(paths.hidden_states, spec, n_rows)
    online = None
    if manifest.is_online:
        online = OnlineSource.from_manifest(paths.hidden_states / "manifest.json", manifest)
    required = special_token_ids(tdir)
    init, init_dir = None, None
    if cfg.train.init_from:
        init = describe(cfg.train.init_from)
        # checked in the source's own format, before an original one is converted
        check_compatible(
            init,
            source_layout(init, spec.num_layers),
            run_layout(shape, spec, cfg.train.draft_vocab_size, cfg.train.draft),
        )
        init_dir = speculators_dir(init, tdir, paths.state, spec)
    fp = fingerprint(cfg, spec, shape, n_rows, runtime, "online" if online else "offline", init)
    t = cfg.train
    return TrainPlan(
        train=t,
        seed=cfg.seed,
        target=cfg.model.name,
        hardware=cfg.hardware.name,
        recipe=TrainRecipe(
            optimizer=str(t.optimizer),
            lr=t.lr,
            muon_lr=t.muon_lr,
            scheduler=str(t.scheduler),
            norm_before_fc=norm_before_fc_on(t.draft),
            fc_norm=t.draft.fc_norm,
            norm_output=t.draft.norm_output,
            ttt_step_loss_decay=t.ttt_step_loss_decay,
        ),
        spec=spec,
        shape=shape,
        runtime=runtime,
        paths=paths,
        n_rows=n_rows,
        required_tokens=required,
        fingerprint=fp,
        parallel_reason=reason,
        online=online,
        init=init,
        init_dir=init_dir,
    )


def fingerprint(
    cfg: TrainInputs,
    spec: TargetSpec,
    shape: DraftShape,
    n_rows: int,
    runtime: Runtime,
    mode: str = "offline",
    init: InitSource | None = None,
) -> str:
    """What a resumable state must match: every setting that changes the trajectory."""
    t = asdict(cfg.train)
    # a former test-only key, never part of the trajectory: dropped while configs carry it,
    # so states keep their fingerprint once it is gone
    t.pop("fail_after_steps", None)
    # how batches are fetched and figures read back never changes the trajectory
    t.pop("prefetch_batches", None)
    t.pop("log_every_steps", None)
    blob = json.dumps(
        {
            "train": t,
            "seed": cfg.seed,
            "target": spec.to_dict(),
            "shape": shape.to_dict(),
            "rows": n_rows,
            # one node's states keep the fingerprint they had before nodes were recorded
            "runtime": {k: v for k, v in asdict(runtime).items() if (k, v) != ("nodes", 1)},
            # online states are rounded apart from the offline files: not resumed across modes
            **({"hidden_states": mode} if mode != "offline" else {}),
            # a warm start's states belong to its source's content, not to its path
            **({"init_from": init.sha256} if init is not None else {}),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
