"""The extract stage's two records: its details and the hidden states' manifest.

- :class:`ExtractRecord`, ``metrics/details/extract.json`` (``extract.rank<N>.json`` for
  rank N > 0): what a run computed and what it cost, the same record for both backends
  and online mode (built by :func:`eagle3_pipeline.extract.extraction.extract_record`);
  the plan reads its measured ``tokens_per_s``.
- :class:`ExtractManifest`, ``data/hidden_states/manifest.json``: what makes two
  hidden-state files incompatible (:func:`~.manifest.manifest_key`), the rows they were
  extracted from and, online, the engine the train stage starts. Read back by the next
  extraction (what it may reuse) and by the train stage.

Only the standard library and ``core`` are imported here: the plan (run by preflight) and
the train stage read these records without running the extraction code.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_pipeline.core.records import Record, optional
from eagle3_pipeline.runtime.precision import Precision
from eagle3_pipeline.serving.engine import Engine


@dataclass(kw_only=True)
class ExtractRecord(Record):
    STAGE = "extract"

    mode: str  # extract.mode: offline (one file per row) or online (the manifest only)
    backend: str  # extract.backend: hf or vllm (online: vllm, in the train stage)
    hardware: str  # the hardware profile's name: the plan trusts only its own profile's rate
    target: str  # the target's name (model.name)
    aux_layer_ids: list[int]  # the layers whose inputs were captured, then the final state
    vllm_layer_ids: list[int] | None = optional()  # vllm: the ids vLLM captures (+ final)
    dtype: str  # extract.dtype of the stored states
    # the target's precision while computing them, and why (model.dtype, else preflight's
    # choice)
    precision: Precision
    rank: int  # extract.rank
    world_size: int  # extract.world_size
    samples: int  # prepared rows
    tokens: int  # their tokens
    samples_written: int  # files written by this run
    samples_reused: int  # files of an earlier run kept
    samples_converted: int | None = optional()  # vllm: files converted to extract.dtype
    tokens_computed: int  # tokens forwarded by this run
    # hf: the batch plan (extract.batch_tokens) and this rank's share of it
    batches_total: int | None = optional()
    batches_rank: int | None = optional()
    batches_computed: int | None = optional()
    batches_skipped: int | None = optional()  # every row already extracted
    padding_efficiency: float | None = optional()  # hf: real / padded tokens forwarded
    tokens_per_s: float  # tokens_computed per second of computing them (0 when none)
    wall_s: float  # the whole run
    # hf: where the time went
    compute_wall_s: float | None = optional()  # the batch loop
    forward_s: float | None = optional()
    capture_s: float | None = optional()
    serialize_s: float | None = optional()
    fsync_s: float | None = optional()
    queue_wait_s: float | None = optional()  # forwards waiting on the writer thread
    bytes_written: int  # of hidden-state files (online: of the manifest)
    bytes_per_token: float  # bytes_written / tokens_computed (0 when none)
    peak_rss_bytes: int  # the stage process's peak resident memory
    threads: int | None = optional()  # hf: torch's intra-op threads
    # hf: where the target's forwards ran and in which dtype (read off the loaded model,
    # not the settings: a GPU proof asserts them); unset when no batch was computed
    device: str | None = optional()  # cpu or cuda
    model_dtype: str | None = optional()  # the loaded weights' dtype (model.dtype)
    peak_gpu_memory_bytes: int | None = optional()  # hf on CUDA: torch's peak allocation
    # vllm: the server's parallelism (hardware.serving)
    tensor_parallel_size: int | None = optional()
    pipeline_parallel_size: int | None = optional()
    enable_expert_parallel: bool | None = optional()
    offline_files_removed: int | None = optional()  # online: files of an offline run removed


@dataclass(frozen=True)
class ManifestTarget:
    """The target the states were computed from (part of the manifest's key)."""

    name: str  # the target's short name
    hub_id: str | None  # its hub id (null: a local target)
    revision: str | None  # a pinned commit: it alone identifies the weights
    architecture: str  # its transformers architecture
    num_layers: int  # its decoder layers
    hidden_size: int  # the width of each stored state
    vocab_size: int  # its vocabulary
    weights: str | None  # the weights' fingerprint when no pinned revision says which


@dataclass(frozen=True)
class ManifestLayers:
    """Which residual-stream states each file holds, in which order (part of the key)."""

    aux_layer_ids: list[int]  # id k: the stream entering layer k
    final: str  # where the last state is taken (before_final_norm)
    layout: str  # the tensor layout, in words


@dataclass(frozen=True)
class ManifestSamples:
    """The rows the files were extracted from."""

    count: int  # rows
    tokens: int  # their tokens
    input_ids_sha256: str  # of every row's ids, in order (proves an extension)


@dataclass(frozen=True)
class ExtractPlan:
    """How the states were computed: hf's batch plan, or the layers vLLM captures."""

    batch_tokens: int | None = optional()  # hf: padding-aware token budget of a batch
    plan_rows: int | None = optional()  # hf: rows per planning window
    batches: int | None = optional()  # hf: batches planned
    vllm_layer_ids: list[int] | None = optional()  # vllm: the layer ids vLLM captures


@dataclass(frozen=True)
class OnlineSection:
    """``extract.mode=online``: the extraction server the train stage starts for the length
    of training (the engine with a placeholder for its staging directory), and how."""

    engine: Engine  # the vLLM engine train serves (staging directory as a placeholder)
    python: str | None  # the vLLM environment's python (vllm.python; null: found)
    port: int  # the server's port on 127.0.0.1
    concurrency: int  # requests in flight per worker
    staging_dir: str | None  # where the connector writes (null: a temporary directory)
    startup_timeout_s: float  # seconds the server may take to start
    shutdown_timeout_s: float  # and to stop
    log_file: str  # the server's log


@dataclass(kw_only=True)
class ExtractManifest(Record):
    STAGE = "extract"
    # Manifests from before versions carry the same keys (an offline one no ``mode``): the
    # hidden states under them stay reusable instead of being extracted again.
    UNVERSIONED_AS = 1

    # the key: files are only added to a directory whose manifest carries exactly it
    format: str  # the files' format (layout.FORMAT)
    backend: str  # hf or vllm: who computed the states
    target: ManifestTarget  # name, hub id, revision, architecture, sizes, weights
    tokenizer_sha256: str  # the tokenizer the rows were rendered with
    layers: ManifestLayers  # aux_layer_ids, where the final state is, the tensor layout
    hidden_size: int  # the states' last dimension
    dtype: str  # extract.dtype of the stored states
    # the target's precision that computed them (a manifest from before it: None, and its
    # files are not reused by a run that states one)
    compute_dtype: str | None = optional()
    # what the files were extracted from and how
    samples: ManifestSamples  # count, tokens and input_ids_sha256 of the rows
    plan: ExtractPlan  # hf: the batch plan's settings; vllm: the layer ids vLLM captures
    mode: str = "offline"  # extract.mode: offline (one file per row) or online (no files)
    online: OnlineSection | None = optional()  # online: the engine the train stage starts
    # offline: entry i is the hash of the row whose states hs_i.safetensors holds (sha256 of
    # its length and int64 input_ids, first 32 hex digits; :func:`~.manifest.row_hashes`),
    # one per row, then any kept past the rows by a shrink. What proves a file reusable
    # when rows shrink or change; a manifest without it (written before it) proves only an
    # extension, by ``samples.input_ids_sha256``.
    row_sha256: list[str] | None = optional()

    @property
    def is_online(self) -> bool:
        return self.mode == "online"
