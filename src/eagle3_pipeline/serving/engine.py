"""The one description of a vLLM engine, and the one builder of it.

Extraction (``extract_hidden_states``), regeneration (plain serving), validation (target
+ EAGLE-3 draft) and the plan all need "vLLM with this target on this hardware": the
same parallel sizes, dtype, eager mode and CPU-build workarounds. :func:`build_engine`
makes that :class:`Engine` from the config once; an engine then renders itself as a
``vllm serve`` command line (:meth:`Engine.serve_argv`) or as ``vllm.LLM`` keyword
arguments (:meth:`Engine.llm_kwargs`, used by :mod:`eagle3_pipeline.serving.worker`), so the
offline and the served paths cannot drift apart, and the plan prints what runs.

Every engine carries its dtype explicitly: vLLM's ``auto`` turns a float32 checkpoint
into bfloat16 on the CPU, which silently changes greedy outputs
(``vllm/config/model.py`` ``_resolve_auto_dtype``: a float32 config dtype becomes the
platform's first supported dtype, bfloat16 in ``CpuPlatform.supported_dtypes``).

**bf16 on the CPU build (vLLM 0.32) needs nothing beyond ``--dtype bfloat16``**; read in
its source, where a setting could have been needed:

- *KV cache dtype*: left at ``auto`` (no ``--kv-cache-dtype``), which is the model's dtype
  (``vllm/config/cache.py`` ``CacheConfig.cache_dtype``;
  ``vllm/utils/torch_utils.py`` ``kv_cache_dtype_str_to_dtype``). The draft's follows the
  target's: ``SpeculativeConfig.kv_cache_dtype`` None inherits it
  (``vllm/config/speculative.py`` ``_DRAFT_VLLM_CONFIG_OVERRIDES``).
- *Attention backend*: every non-MLA layer gets ``CPU_ATTN`` whatever is asked
  (``vllm/platforms/cpu.py`` ``CpuPlatform.get_attn_backend_cls``); it takes bf16
  (``vllm/v1/attention/backends/cpu_attn.py`` ``CPUAttentionBackend.supported_dtypes``)
  and picks its kernel itself: ``_get_attn_isa`` runs the ``amx`` one for bf16 on a CPU
  with AMX tiles when the block size is a multiple of 32 (the platform's default block of
  128, ``CpuPlatform.check_and_update_config``), ``vec``/``vec16`` otherwise; float32
  never gets the AMX kernel. The linear layers likewise dispatch on the weights' dtype
  (``vllm/model_executor/layers/utils.py`` ``dispatch_cpu_unquantized_gemm``: oneDNN, or
  the SGL packed kernel for small weights).
- *The draft's dtype*: vLLM builds the draft's model config with the target's dtype
  (``SpeculativeConfig.__post_init__``: ``dtype=self.target_model_config.dtype``), creates
  its parameters in it (``vllm/model_executor/model_loader/base_loader.py``
  ``BaseModelLoader.load_model``, ``set_default_torch_dtype``) and copies the float32
  checkpoint's tensors into them, casting (``model_loader/weight_utils.py``
  ``default_weight_loader``: ``param.data.copy_``); the ``d2t`` map stays int64
  (``models/llama_eagle3.py``). So a draft trained and saved in float32 is served in bf16
  as saved, with no conversion of ours.
- *MLA*: see :mod:`eagle3_pipeline.compat.vllm`, workaround 5: in bf16 target and draft
  keep vLLM's pick, ``AMX_MLA`` on a CPU with AMX tiles, ``CPU_MLA`` elsewhere.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from eagle3_pipeline.compat import vllm as vllm_compat
from eagle3_pipeline.core.choices import Device, Dtype
from eagle3_pipeline.core.config import ServingConfig, VllmConfig
from eagle3_pipeline.core.records import optional, plain

PURPOSES = ("extract", "regenerate", "validate", "baseline")
# An online extraction engine is recorded by the extract stage before the train stage picks
# the directory its connector writes to; this stands for that directory until then.
STAGING_PLACEHOLDER = "${staging}"


@dataclass
class HiddenStateLayers:
    """``draft_model_config.hf_config`` of vLLM's ``extract_hidden_states`` method."""

    eagle_aux_hidden_state_layer_ids: list[int]  # the layers whose input state is captured


@dataclass
class DraftModelConfig:
    """``draft_model_config`` of vLLM's speculative config (extraction only)."""

    hf_config: HiddenStateLayers  # what the extraction "draft" reads


@dataclass(kw_only=True)
class SpeculativeConfig:
    """vLLM's ``--speculative-config`` as we pass it (keys vLLM's, unset ones left out)."""

    method: str  # eagle3 (a draft) or extract_hidden_states (extraction)
    model: str | None = optional()  # the draft's directory (eagle3)
    num_speculative_tokens: int  # K (1 for extraction)
    draft_model_config: DraftModelConfig | None = optional()  # extraction's layers
    # the draft's attention backend (vLLM never gives the draft the target's: None means
    # vLLM selects one afresh; compat.vllm workaround 5 sets it)
    attention_backend: str | None = optional()


@dataclass(kw_only=True)
class KvTransferConfig:
    """vLLM's ``--kv-transfer-config``: the connector that writes hidden states to disk."""

    kv_connector: str  # the connector class (compat.vllm picks the CPU-safe one here)
    kv_connector_module_path: str | None = optional()  # where that class lives, if not vLLM
    kv_role: str  # kv_producer: the engine writes
    kv_connector_extra_config: dict[str, str]  # shared_storage_path: where it writes


@dataclass
class CompilationConfig:
    """vLLM's ``--compilation-config`` as we pass it (a CPU-build workaround)."""

    custom_ops: list[str]  # custom ops switched on or (with a leading -) off


@dataclass
class Engine:
    """One vLLM engine: what ``vllm serve`` and ``vllm.LLM`` are given."""

    model: str  # the target's directory or hub id
    dtype: str  # explicit, never auto
    served_model_name: str  # the name the OpenAI API answers to
    max_model_len: int  # the longest sequence it admits
    tensor_parallel_size: int = 1  # GPUs per pipeline stage
    pipeline_parallel_size: int = 1  # pipeline stages
    data_parallel_size: int = 1  # engine replicas
    enable_expert_parallel: bool = False  # MoE experts spread over the GPUs
    gpu_memory_utilization: float = 0.9  # share of each GPU's memory it may take
    enforce_eager: bool = False  # no CUDA graphs / compilation
    trust_remote_code: bool = False  # the model's own code may run
    revision: str | None = None  # the pinned hub revision
    seed: int = 0  # vLLM's sampling seed
    speculative_config: SpeculativeConfig | None = None  # a draft, or extraction
    kv_transfer_config: KvTransferConfig | None = None  # extraction's connector
    compilation_config: CompilationConfig | None = None  # a CPU-build workaround
    attention_backend: str | None = None  # forced attention backend (null: vLLM's pick)
    enable_prefix_caching: bool | None = None  # false: every prompt computed (extraction)
    generation_config: str | None = None  # "vllm": ignore the model's sampling defaults
    max_num_seqs: int | None = None  # requests in flight at most; null: vLLM's default
    env: dict[str, str] = field(default_factory=dict)  # for the vLLM process
    extra_args: list[str] = field(default_factory=list)  # `vllm serve` only

    def serve_argv(
        self, port: int, executable: Sequence[str] = ("vllm",), host: str = "127.0.0.1"
    ) -> list[str]:
        """``vllm serve`` as an argv list (no shell)."""
        cmd = [
            *executable,
            "serve",
            self.model,
            "--host",
            host,
            "--port",
            str(int(port)),
            "--served-model-name",
            self.served_model_name,
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.max_model_len),
            "--seed",
            str(self.seed),
            "--tensor-parallel-size",
            str(self.tensor_parallel_size),
        ]
        if self.pipeline_parallel_size > 1:
            cmd += ["--pipeline-parallel-size", str(self.pipeline_parallel_size)]
        if self.data_parallel_size > 1:
            cmd += ["--data-parallel-size", str(self.data_parallel_size)]
        if self.enable_expert_parallel:
            cmd.append("--enable-expert-parallel")
        if self.gpu_memory_utilization != 0.9:
            cmd += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        if self.revision:
            cmd += ["--revision", self.revision]
        if self.trust_remote_code:
            cmd.append("--trust-remote-code")
        for flag, value in (
            ("--speculative-config", self.speculative_config),
            ("--kv-transfer-config", self.kv_transfer_config),
            ("--compilation-config", self.compilation_config),
        ):
            if value is not None:
                cmd += [flag, vllm_json(value)]
        if self.attention_backend:
            cmd += ["--attention-backend", self.attention_backend]
        if self.enable_prefix_caching is False:
            cmd.append("--no-enable-prefix-caching")
        if self.generation_config:
            cmd += ["--generation-config", self.generation_config]
        if self.max_num_seqs is not None:
            cmd += ["--max-num-seqs", str(self.max_num_seqs)]
        return cmd + list(self.extra_args)

    def llm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``vllm.LLM`` for the same engine."""
        kw: dict[str, Any] = {
            "model": self.model,
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            "seed": self.seed,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "enforce_eager": self.enforce_eager,
            "trust_remote_code": self.trust_remote_code,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "disable_log_stats": False,  # the spec-decode counters are stats
        }
        if self.enable_expert_parallel:
            kw["enable_expert_parallel"] = True
        for key in (
            "revision",
            "speculative_config",
            "kv_transfer_config",
            "compilation_config",
            "attention_backend",
            "enable_prefix_caching",
            "generation_config",
            "max_num_seqs",
        ):
            value = getattr(self, key)
            if value is not None:
                kw[key] = plain(value)
        return kw

    def shell(self, port: int, executable: Sequence[str] = ("vllm",)) -> str:
        """The command as a user would type it, environment included."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = " ".join(shlex.quote(a) for a in self.serve_argv(port, executable))
        return f"{env} {cmd}" if env else cmd


def vllm_json(config: SpeculativeConfig | KvTransferConfig | CompilationConfig) -> str:
    """One of vLLM's JSON arguments as its command line takes it (unset keys left out)."""
    return json.dumps(plain(config), separators=(",", ":"))


def _compilation(config: dict[str, list[str]] | None) -> CompilationConfig | None:
    return None if config is None else CompilationConfig(**config)


def eagle3_config(
    draft_dir: str | Path, k: int, attention_backend: str | None = None
) -> SpeculativeConfig:
    """The speculative config of an EAGLE-3 draft; every engine with a draft gets it from
    :func:`build_engine`, which asks ``compat.vllm`` for ``attention_backend``."""
    if k < 1:
        raise ValueError(f"num_speculative_tokens={k} must be >= 1")
    return SpeculativeConfig(
        method="eagle3",
        model=str(Path(draft_dir).absolute()),
        num_speculative_tokens=int(k),
        attention_backend=attention_backend,
    )


def extract_config(layer_ids: Sequence[int]) -> SpeculativeConfig:
    """vLLM's ``extract_hidden_states`` method: the residual stream entering each listed
    layer; id ``num_layers`` is the final state before the norm."""
    return SpeculativeConfig(
        method="extract_hidden_states",
        num_speculative_tokens=1,
        draft_model_config=DraftModelConfig(HiddenStateLayers([int(i) for i in layer_ids])),
    )


class _ServingHardware(Protocol):
    @property
    def device(self) -> Device: ...
    @property
    def serving(self) -> ServingConfig: ...


class _ServedModel(Protocol):
    @property
    def dtype(self) -> Dtype | None: ...


class EngineInputs(Protocol):
    """What building an engine reads of a stage's inputs: ``seed``, ``hardware.device``,
    ``hardware.serving``, ``vllm`` and ``model.dtype`` (every stage that serves the target
    declares them; a tool passes the whole config)."""

    @property
    def seed(self) -> int: ...
    @property
    def hardware(self) -> _ServingHardware: ...
    @property
    def vllm(self) -> VllmConfig: ...
    @property
    def model(self) -> _ServedModel: ...


class _LogDir(Protocol):
    @property
    def vllm(self) -> VllmConfig: ...


def cpu_build(cfg: EngineInputs) -> bool:
    """The CPU build serves where the hardware profile has no GPU."""
    return cfg.hardware.device == "cpu"


def draft_has_mla(draft_dir: str | Path) -> bool:
    """Whether the draft in ``draft_dir`` has MLA attention (its config carries a
    ``kv_lora_rank``, at the top as vLLM serves an MLA draft or in a layer config)."""
    try:
        config = json.loads((Path(draft_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict):
        return False
    layer = config.get("transformer_layer_config")
    return "kv_lora_rank" in config or (isinstance(layer, dict) and "kv_lora_rank" in layer)


def build_engine(
    cfg: EngineInputs,
    spec: Any,
    model: str | Path,
    purpose: str,
    *,
    dtype: str | None = None,
    draft_dir: str | Path | None = None,
    k: int | None = None,
    staging: str | Path | None = None,
    max_num_seqs: int | None = None,
    draft_mla: bool | None = None,
) -> Engine:
    """The engine for ``purpose`` (extract | regenerate | validate | baseline) of target
    ``spec`` (a :class:`~eagle3_pipeline.targets.adapter.TargetSpec`) served from ``model``;
    ``draft_mla``: whether the draft has MLA attention (None: read from ``draft_dir``)."""
    if purpose not in PURPOSES:
        raise ValueError(f"purpose {purpose!r} is not one of {PURPOSES}")
    s, v = cfg.hardware.serving, cfg.vllm
    cpu = cpu_build(cfg)
    mla = spec.attention == "mla"
    with_draft = purpose == "validate"
    if draft_mla is None:  # read from the draft (a plan prints commands before it exists)
        draft_mla = with_draft and draft_dir is not None and draft_has_mla(draft_dir)
    if dtype is None and cfg.model.dtype is None:
        # model.dtype null: the stage resolved preflight's choice and passes it
        raise ValueError("build_engine: no dtype (model.dtype is null: pass the resolved one)")
    dtype = str(dtype or cfg.model.dtype)
    eng = Engine(
        model=str(Path(model).absolute()) if Path(model).exists() else str(model),
        dtype=dtype,
        served_model_name=spec.name,
        # never beyond the model's own window (vLLM refuses that)
        max_model_len=min(s.max_model_len, spec.max_position_embeddings or s.max_model_len),
        tensor_parallel_size=s.tensor_parallel_size,
        pipeline_parallel_size=s.pipeline_parallel_size,
        data_parallel_size=s.data_parallel_size,
        enable_expert_parallel=s.enable_expert_parallel,
        gpu_memory_utilization=s.gpu_memory_utilization,
        enforce_eager=cpu if v.enforce_eager is None else v.enforce_eager,
        trust_remote_code=spec.trust_remote_code,
        revision=spec.revision if not Path(model).exists() else None,
        seed=cfg.seed,
        compilation_config=_compilation(vllm_compat.compilation_config(cpu, mla, spec.rope_type)),
        attention_backend=vllm_compat.mla_backend(cpu, mla, dtype, with_draft, draft_mla),
        env=vllm_compat.engine_env(cpu, mla, with_draft, v.cpu_kvcache_space_gib, draft_mla),
        extra_args=list(v.extra_args),
    )
    if purpose == "validate":
        if draft_dir is None or k is None:
            raise ValueError("a validate engine needs draft_dir and k")
        eng.speculative_config = eagle3_config(
            draft_dir, k, vllm_compat.draft_attention_backend(cpu, dtype, draft_mla)
        )
    elif purpose == "extract":
        if staging is None:
            raise ValueError("an extract engine needs a staging directory")
        where = staging if staging == STAGING_PLACEHOLDER else str(Path(staging).absolute())
        eng.speculative_config = extract_config([*spec.aux_layer_ids, spec.num_layers])
        eng.kv_transfer_config = KvTransferConfig(
            **vllm_compat.hidden_states_connector(cpu),
            kv_role="kv_producer",
            kv_connector_extra_config={"shared_storage_path": where},
        )
        eng.enable_prefix_caching = False  # every prompt computed, its states kept
    elif purpose == "regenerate":
        eng.generation_config = "vllm"  # greedy means greedy, whatever the model card says
    if purpose in ("validate", "baseline"):
        # a sampled figure is at the temperature asked alone (no top-p/top-k from the
        # model card, which the server would apply and the offline engine would not)
        eng.generation_config = "vllm"
    eng.max_num_seqs = max_num_seqs
    return eng


def log_file(cfg: _LogDir, purpose: str) -> Path:
    return Path(cfg.vllm.log_dir) / f"vllm_{purpose}.log"
