"""Every workaround of vLLM's own bugs and gaps, in one place (vLLM's CPU build, 0.32).

Each function says when it applies; :mod:`eagle3_pipeline.serving.engine` asks them and
nothing else decides. ``tests/compat/test_vllm_compat.py`` runs the real vLLM and fails when a
bug below is fixed upstream, so the workaround can then be dropped.

1. **MLA off when a llama / qwen3 draft is served on the CPU build.** EAGLE-3 with MLA
   enabled fails at engine start: "No common block size for 16 (CPU_MLA: [16]; CPU_ATTN:
   [MultipleOf(32)])" — the draft's attention wants multiples of 32, CPU_MLA insists on 16
   and ``block_size=32`` is overridden. ``VLLM_MLA_DISABLE=1`` runs the target without the
   MLA kernels; only engines with such a draft pay for it (plain serving keeps MLA). An
   MLA draft builds MLA attention in any case (``deepseek_eagle3``), so target and draft
   share CPU_MLA and its block size of 16, and MLA stays on.
2. **The rotary custom op off for MLA targets with plain rope on the CPU build.**
   ``RotaryEmbedding.forward_cpu`` is wrong for the 3-D ``[tokens, heads, rope_dim]``
   query/key that MLA passes (exact for 2-D input). Targets with yarn scaling (the real
   Kimi-K2.5 and our tiny one) get ``DeepseekScalingRotaryEmbedding``, which has no CPU
   kernel and takes the native path, so they are not affected.
3. **A CPU hidden-states connector.** The upstream ``ExampleHiddenStatesConnector``
   copies through CUDA streams and pinned memory; on the CPU build the extraction server
   loads :class:`eagle3_pipeline.serving.connector.CpuHiddenStatesConnector` instead.
4. **The KV cache size on the CPU build** is a process-wide env var
   (``VLLM_CPU_KVCACHE_SPACE``, GiB), not ``gpu_memory_utilization``.
5. **The reference MLA backend for float32 on the CPU build, for the target and for the
   draft.** On a CPU with AMX tiles vLLM picks ``AMX_MLA``, whose weight packing refuses
   float32 ("expect weight to be bfloat16, float16, int8, fp8_e4m3 or uint8"), so a float32
   MLA engine -- the tiny target's, where losslessness is checked exactly -- cannot start.
   The rule is the same for each model an engine loads: **CPU build and float32 and that
   model's attention is MLA => ask for ``CPU_MLA``**. The target asks with
   ``--attention-backend`` (:func:`mla_backend`; its attention is MLA unless workaround 1
   turned it off). The draft asks in the speculative config's own ``attention_backend``
   (:func:`draft_attention_backend`): vLLM never gives the draft the target's backend
   (``llm_base_proposer._create_draft_vllm_config`` replaces it by the speculative config's,
   None meaning "select afresh"), so an MLA draft on an AMX CPU fell to ``AMX_MLA`` even
   with the target on ``CPU_MLA``. A llama / qwen3 draft's attention is not MLA
   (``CPU_ATTN``): it asks for nothing, whatever the target. The rule does not read the
   CPU: vLLM's CPU platform (``platforms/cpu.py`` ``get_attn_backend_cls``) returns
   ``CPU_MLA`` for every MLA layer on a CPU without AMX, asked or not, and sets the same
   block size (16) either way, so asking there changes nothing; only on an AMX CPU does
   it choose. bfloat16 / float16 keep vLLM's pick, for the target and the draft alike, and
   that is right for bf16 serving (validate's speed pair, a real target on a CPU with
   native bf16): ``AMX_MLA`` (``v1/attention/backends/mla/amx_mla.py``
   ``AMXMLABackend``) declares bfloat16 only, head size 576 only (``kv_lora_rank`` 512 +
   ``qk_rope_head_dim`` 64: DeepSeek's and Kimi-K2.5's real shape, which a draft resolved
   for that target shares) and block sizes in multiples of 32; the CPU platform hands it
   every MLA layer on an AMX CPU unless ``CPU_MLA`` is asked, checking neither the head size
   nor the dtype (``v1/attention/selector.py`` ``_cached_get_attn_backend`` validates
   nothing on this platform). Asking ``CPU_MLA`` for one of the two models only would
   split the block size (``CpuPlatform.check_and_update_config`` forces 16 only when the
   *target* asks ``CPU_MLA``; ``AMX_MLA`` and ``CPU_ATTN`` want multiples of 32), so both
   keep the same pick. Not covered: a bf16 engine of an MLA shape other than 576 (the tiny
   Kimi-K2.5 with ``model.dtype=bfloat16`` set; its rule keeps it float32) on an AMX CPU
   gets ``AMX_MLA`` at a head size it does not declare -- unmeasured. Also unmeasured:
   with ``AMX_MLA`` (multiples of 32) an MLA target and a llama draft's ``CPU_ATTN`` would
   share a block size, so workaround 1 may not be needed in bf16 on an AMX CPU; it is kept
   (the target then runs without the MLA kernels, correct, slower).
6. **Sampling at temperature > 0 on the CPU build without Triton.** vLLM's C++ fallback for
   the rejection sampler's ``expand_kernel`` loses float and int32 outputs, so temperature,
   top-p and top-k reach the rejection test as garbage. That one is not an engine setting
   but a patch inside vLLM's processes: :mod:`eagle3_pipeline.compat.vllm_expand`, a
   ``vllm.general_plugins`` entry point that decides for itself where it applies.
"""

from __future__ import annotations

# The EAGLE-3.1 switches of a speculators draft config (train.draft.*). vLLM applies one
# only if its speculators-config reader copies it into the draft's config; an option it
# does not copy is silently dropped at serve time (and with it, weights such as
# input_norm.*). The probe below asks the installed vLLM which ones it copies.
EAGLE3_DRAFT_OPTIONS = ("norm_before_fc", "fc_norm", "norm_output")
EAGLE3_OPTIONS_PROBE = (
    "import json\n"
    "from vllm.transformers_utils.configs.speculators.algos import "
    "SUPPORTED_SPECULATORS_TYPES as S\n"
    f"opts = {list(EAGLE3_DRAFT_OPTIONS)!r}\n"
    "out = {}\n"
    "S['eagle3']({o: True for o in opts}, out)\n"
    "print(json.dumps([o for o in opts if out.get(o) is True]))\n"
)

UPSTREAM_CONNECTOR = "ExampleHiddenStatesConnector"
CPU_CONNECTOR = "CpuHiddenStatesConnector"
CPU_CONNECTOR_MODULE = "eagle3_pipeline.serving.connector"


def mla_disabled(cpu_build: bool, mla: bool, with_draft: bool, draft_mla: bool = False) -> bool:
    """Workaround 1: disable MLA for this engine (``draft_mla``: the draft is an MLA one)."""
    return cpu_build and mla and with_draft and not draft_mla


def rotary_op_disabled(cpu_build: bool, mla: bool, rope_type: str) -> bool:
    """Workaround 2: plain rope (vLLM's ``RotaryEmbedding``) on an MLA target, CPU build."""
    return cpu_build and mla and rope_type in ("default", "linear", "dynamic")


def _float32_mla_backend(cpu_build: bool, attention_is_mla: bool, dtype: str) -> str | None:
    """Workaround 5's one rule, for any model an engine loads."""
    return "CPU_MLA" if cpu_build and attention_is_mla and dtype == "float32" else None


def mla_backend(
    cpu_build: bool, mla: bool, dtype: str, with_draft: bool, draft_mla: bool = False
) -> str | None:
    """Workaround 5 for the target (``--attention-backend``): the backend to request, or
    None for vLLM's choice. ``mla``: the target has MLA attention (kept on unless
    workaround 1 turns it off)."""
    target_mla = mla and not mla_disabled(cpu_build, mla, with_draft, draft_mla)
    return _float32_mla_backend(cpu_build, target_mla, dtype)


def draft_attention_backend(cpu_build: bool, dtype: str, draft_mla: bool) -> str | None:
    """Workaround 5 for the draft (the speculative config's ``attention_backend``): the
    backend to request, or None for vLLM's choice. ``draft_mla``: the draft has MLA
    attention (an MLA draft builds it whatever the target does)."""
    return _float32_mla_backend(cpu_build, draft_mla, dtype)


def engine_env(
    cpu_build: bool,
    mla: bool,
    with_draft: bool,
    kvcache_space_gib: float | None,
    draft_mla: bool = False,
) -> dict[str, str]:
    env: dict[str, str] = {}
    if mla_disabled(cpu_build, mla, with_draft, draft_mla):
        env["VLLM_MLA_DISABLE"] = "1"
    if cpu_build and kvcache_space_gib:
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{kvcache_space_gib:g}"
    return env


def compilation_config(cpu_build: bool, mla: bool, rope_type: str) -> dict[str, list[str]] | None:
    if rotary_op_disabled(cpu_build, mla, rope_type):
        return {"custom_ops": ["-rotary_embedding"]}
    return None


def hidden_states_connector(cpu_build: bool) -> dict[str, str]:
    """Workaround 3: the ``kv_connector`` fields of ``--kv-transfer-config``."""
    if cpu_build:
        return {"kv_connector": CPU_CONNECTOR, "kv_connector_module_path": CPU_CONNECTOR_MODULE}
    return {"kv_connector": UPSTREAM_CONNECTOR}


# What the installed vLLM's attention selection says of a head size and dtype: the backend
# it would pick on this platform (with a default config, as at engine start) and that
# backend's own supports_head_size / supports_dtype. Why ask: the CPU build's kernel
# refuses other head sizes only when the engine starts ("Unsupported CPU attention
# configuration"), i.e. after training; the list is vLLM's, never copied here.
ATTENTION_PROBE = (
    "import json, sys\n"
    "import torch\n"
    "from vllm.config import VllmConfig, set_current_vllm_config\n"
    "from vllm.v1.attention.selector import get_attn_backend\n"
    "out = []\n"
    "with set_current_vllm_config(VllmConfig()):\n"
    "    for q in json.loads(sys.argv[1]):\n"
    "        dtype = getattr(torch, q['dtype'])\n"
    "        try:\n"
    "            b = get_attn_backend(q['head_size'], dtype, None, num_heads=q.get('num_heads'))\n"
    "            out.append({'backend': b.get_name(),\n"
    "                        'head_size_ok': bool(b.supports_head_size(q['head_size'])),\n"
    "                        'dtype_ok': bool(b.supports_dtype(dtype)),\n"
    "                        'head_sizes': [int(h) for h in b.get_supported_head_sizes()]})\n"
    "        except Exception as exc:\n"
    "            out.append({'error': f'{type(exc).__name__}: {exc}'})\n"
    "print(json.dumps(out))\n"
)
