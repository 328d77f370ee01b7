"""The EAGLE-3 draft's training: one loop for CPU, one GPU and torchrun (DDP or FSDP2).

- :mod:`.launch` -- the stage's one call: in this process, or torchrun + the GPU reading;
  :mod:`.worker` is the torchrun worker's command line, :mod:`.run` one process's run.
- :mod:`.plan` -- what a run is decided by, checked before anything starts, from
  :mod:`.runtime` (device, dtype, kernels, parallel mode) and :mod:`.inputs` (target,
  prepared rows, hidden states).
- :mod:`.loop` -- the trainer, over :mod:`.batches` (speculators' data path) and
  :mod:`.distributed` (process group, collectives, DDP / FSDP2).
- :mod:`.state` (resume), :mod:`.save` (the draft), :mod:`.live` (curves, through dvclive),
  :mod:`.metrics` (``paths.details``/train.json).
"""
