"""``metrics/details/train.json``: every figure of one training run.

Rank 0 builds it (:func:`eagle3_pipeline.train.run.run_record`); the stage completes
it with how the workers were launched and NVML's reading once they exited. The plan
reads the measured ``tokens_per_s`` back; the headline field goes to dvclive's summary
(:func:`eagle3_pipeline.train.live.write_summary`), next to dvclive's own step and val loss.

No training code is imported here (``core``, the GPU reading's record and the draft's
shape, which imports neither torch nor speculators): the plan (run by preflight) reads
this record without running the training code.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_pipeline.core.records import Record, headline, optional
from eagle3_pipeline.draft.shape import DraftShape
from eagle3_pipeline.runtime.gpu import GpuRelease


@dataclass(frozen=True)
class TrainRecipe:
    """How the draft was trained, as ``bench/recipe.py`` and docs/guide.md compare recipes."""

    optimizer: str  # train.optimizer
    lr: float  # AdamW's (and Muon's 1-D parameters')
    muon_lr: float | None  # Muon's matrices' (null: lr, speculators' rule)
    scheduler: str  # train.scheduler
    norm_before_fc: bool  # EAGLE-3.1: the aux states normalised before fc
    fc_norm: bool  # EAGLE-3.1: fc's output normalised
    norm_output: bool  # EAGLE-3.1: the layer's output normalised before lm_head
    ttt_step_loss_decay: float  # weight of TTT step i: decay**i


@dataclass(frozen=True)
class InitFrom:
    """train.init_from: the warm start's source."""

    path: str  # as configured
    format: str  # speculators, mla or eagle3: the layout it was read in
    sha256: str  # of its content: a resumable state belongs to it


@dataclass(frozen=True)
class Launcher:
    """How torchrun was started for this run."""

    command: str  # the torchrun command line, as run
    nproc: int  # workers on this node
    nodes: int  # torchrun's --nnodes
    process_group: int  # the group stopped as one on error or Ctrl-C
    survivors: int  # its processes still alive once torchrun returned (killed then)


@dataclass(frozen=True)
class EpochSharding:
    """One epoch's data parallelism: the rows each rank trained on, summed over ranks."""

    epoch: int  # 0-based
    rows_per_rank: list[int]  # rows each rank trained on, by rank
    rows_seen: int  # distinct rows some rank trained on
    rows_on_several_ranks: int  # rows more than one rank trained on (0: the data is sharded)
    train_rows: int  # rows of the training split


@dataclass(frozen=True)
class EpochCandidate:
    """One epoch's draft as the choice saw it: its figures on the held-out rows."""

    epoch: int  # 0-based
    step: int  # the optimizer step it ended at
    val_loss: float  # held-out loss (sum over TTT steps)
    val_acceptance: float  # 1 + the summed per-position accuracies on the held-out rows
    val_accuracy_per_position: list[float]  # all draft tokens up to position i correct


@dataclass(frozen=True)
class CheckpointChoice:
    """Which epoch's draft was written, by what measure, among which candidates."""

    measure: str  # train.select: val_acceptance, val_loss or last
    chosen_epoch: int  # the written draft's epoch (0-based)
    chosen_step: int  # ... and its step
    candidates: list[EpochCandidate]  # every epoch validated, in order
    stopped_early: bool  # train.patience ended the run before train.epochs
    patience: int | None  # train.patience


@dataclass(kw_only=True)
class TrainRecord(Record):
    STAGE = "train"
    HEADLINE_IN_DVCLIVE = True

    # 2: the target's name is ``target``, as in every other record (was ``model``)
    version: int = 2

    val_loss: float  # on the held-out rows (sum over TTT steps), of the draft written
    val_loss_untrained: float | None  # the same before the first step (None: not measured)
    val_loss_ratio: float | None  # val_loss / val_loss_untrained
    val_accuracy_per_position: list[float]  # all draft tokens up to position i correct
    val_conditional_accuracy_per_position: list[float]  # position i correct given i-1 was
    val_untrained_accuracy_per_position: list[float] | None  # before the first step
    steps: int  # optimizer steps, all runs
    total_steps: int  # what the run was planned for
    steps_this_run: int  # after a resume, fewer than steps
    resumed: bool  # this run continued a killed one's state
    steps_per_s: float  # this run's
    tokens_per_s: float = headline()  # training tokens per second, this run's
    wall_s: float  # the run, end to end
    peak_memory_mib: float  # rank 0: CUDA peak allocation, or peak RSS on CPU
    device: str  # cpu or cuda
    dtype: str  # the training dtype (bf16: autocast over float32 master weights)
    dtype_why: str  # why: train.dtype, hardware.train_dtype, or preflight's choice on a CPU
    attn_implementation: str  # the draft's attention kernel
    loss_implementation: str  # cpu, eager or fused loss (train/losses.py)
    world_size: int  # training processes
    parallel: str  # ddp, fsdp or none (one process)
    parallel_reason: str  # why that parallel mode
    distributed_backend: str | None  # nccl or gloo, None in one process
    data_parallel: list[EpochSharding]  # per epoch: which rank trained on which rows
    hardware: str  # the hardware profile's name: the plan trusts only its own profile's rate
    target: str  # the target's name (model.name): the plan trusts only its own target's rate
    draft_shape: DraftShape  # the draft's layers, heads, sizes (and an MLA layer's latents)
    draft_vocab_size: int  # train.draft_vocab_size
    recipe: TrainRecipe  # optimizer, learning rates, scheduler, norms, loss decay
    required_tokens: dict[str, int]  # special tokens the draft vocabulary must keep
    aux_layer_ids: list[int] | None  # the target layers the saved draft reads
    trainable_parameters: int  # of the draft, on rank 0
    local_parameter_fraction: float  # share rank 0 holds: 1 unsharded, ~1/world under FSDP
    train_rows: int  # rows trained on
    val_rows: int  # rows held out for val_loss
    init_from: InitFrom | None = optional()  # the warm start's source (None: fresh weights)
    # added by the stage (hidden_states: by rank 0): how torchrun ran, NVML once it ended
    launcher: Launcher | None = optional()  # torchrun's (None: trained in the stage's process)
    hidden_states: str  # offline (files) or online (a vLLM server during training)
    # the epoch whose draft was written (train.select) and the others' figures
    checkpoint: CheckpointChoice | None = optional()
    gpu: GpuRelease  # NVML after the workers exited, vs preflight's snapshot
    gpu_released: bool | None  # GPU memory back to preflight's reading (None: not checked)
