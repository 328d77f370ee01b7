"""``metrics/details/target.json``: what the target stage resolved, and what building it cost.

The shape facts later stages use live in ``target.json`` (:class:`~.adapter.TargetSpec`);
this record repeats the few a reader of the figures wants next to them. The figures of a
built target are set only for the kind that was built: the tiny target's training and
perplexities, a GGUF file's conversion (``gguf``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eagle3_pipeline.core.records import Record, optional


@dataclass(kw_only=True)
class TargetRecord(Record):
    STAGE = "target"

    built: bool  # the stage wrote the checkpoint (tiny or GGUF) rather than describing one
    name: str  # model.name
    architecture: str  # the HF architecture of config.json
    num_layers: int  # decoder layers of the target
    hidden_size: int  # the target's hidden size
    vocab_size: int  # the target's vocabulary
    aux_layer_ids: list[int]  # the layers whose inputs the draft reads
    # the tiny target (model.tiny)
    parameters: int | None = optional()  # its parameter count
    train_tokens: int | None = optional()  # tokens of its training corpus
    heldout_tokens: int | None = optional()  # tokens of its held-out corpus
    heldout_perplexity: float | None = optional()  # after training
    heldout_perplexity_untrained: float | None = optional()  # before training
    unigram_perplexity: float | None = optional()  # a unigram model's on the same tokens
    perplexity_ratio_vs_unigram: float | None = optional()  # < 1: it learned the corpus
    reload_logits_identical: bool | None = optional()  # the saved checkpoint reloads exactly
    build_wall_s: float | None = optional()  # building it, end to end
    threads: int | None = optional()  # torch's intra-op threads
    cpu_count: int | None = optional()  # the machine's cores
    final_train_loss: float | None = optional()  # at its last training step
    train_wall_s: float | None = optional()  # its training loop
    train_steps: int | None = optional()  # target.train_steps
    # a GGUF target (model.gguf): the file, its SHA-256, the logits check, versions, timings
    gguf: dict[str, Any] | None = optional()
