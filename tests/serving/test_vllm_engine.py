"""The one vLLM engine builder: every purpose gets the dtype, the parallel sizes and the
CPU-build workarounds from one place, and the served and offline forms agree."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from target_samples import target_spec

from eagle3_pipeline.compat import vllm as vllm_compat
from eagle3_pipeline.core.config import load_config
from eagle3_pipeline.serving.engine import build_engine
from eagle3_pipeline.targets.adapter import TargetSpec

REPO = Path(__file__).resolve().parents[2]


def _spec(**kw: Any) -> TargetSpec:
    return target_spec(**kw)


def _cfg(*overrides: str):
    """The config with the target's precision stated (model.dtype null is resolved by the
    stage from preflight's choice, and build_engine refuses to guess it)."""
    if not any(o.startswith("model.dtype=") for o in overrides):
        overrides = ("model.dtype=float32", *overrides)
    return load_config(list(overrides), conf_dir=REPO / "conf")


def test_validate_engine_on_cpu_carries_dtype_draft_and_only_the_needed_workaround(tmp_path):
    cfg = _cfg()
    eng = build_engine(
        cfg, _spec(), tmp_path, "validate", dtype="float32", draft_dir=tmp_path / "draft", k=3
    )
    argv = eng.serve_argv(8011)
    assert argv[argv.index("--dtype") + 1] == "float32"
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {
        "method": "eagle3",
        "model": str((tmp_path / "draft").absolute()),
        "num_speculative_tokens": 3,
    }
    assert "--enforce-eager" in argv  # CPU default
    assert (
        eng.env["VLLM_MLA_DISABLE"] == "1" and eng.attention_backend is None
    )  # no MLA: no MLA backend
    assert eng.compilation_config is None  # yarn rope takes the native path
    kw = eng.llm_kwargs()
    assert kw["dtype"] == "float32" and kw["speculative_config"] == spec  # plain JSON for vLLM
    assert shlex.split(eng.shell(8011)) == ["VLLM_CPU_KVCACHE_SPACE=1", "VLLM_MLA_DISABLE=1", *argv]


def test_plain_engines_keep_mla_and_extraction_gets_the_cpu_connector(tmp_path):
    cfg = _cfg()
    base = build_engine(cfg, _spec(), tmp_path, "baseline", dtype="float32")
    assert "VLLM_MLA_DISABLE" not in base.env and base.speculative_config is None
    # float32 MLA asks for the reference backend (AMX_MLA refuses float32 weights)
    assert (
        base.attention_backend == "CPU_MLA" and base.llm_kwargs()["attention_backend"] == "CPU_MLA"
    )
    argv = base.serve_argv(8000)
    assert argv[argv.index("--attention-backend") + 1] == "CPU_MLA"
    assert (
        build_engine(cfg, _spec(), tmp_path, "baseline", dtype="bfloat16").attention_backend is None
    )
    ext = build_engine(cfg, _spec(), tmp_path, "extract", staging=tmp_path / "s")
    assert ext.speculative_config is not None and ext.kv_transfer_config is not None
    assert ext.speculative_config.method == "extract_hidden_states"
    drafted = ext.speculative_config.draft_model_config
    assert drafted is not None and drafted.hf_config.eagle_aux_hidden_state_layer_ids == [
        1,
        2,
        3,
        4,
    ]
    assert ext.kv_transfer_config.kv_connector == vllm_compat.CPU_CONNECTOR
    assert ext.kv_transfer_config.kv_connector_module_path == vllm_compat.CPU_CONNECTOR_MODULE
    kv = json.loads(ext.serve_argv(8000)[ext.serve_argv(8000).index("--kv-transfer-config") + 1])
    assert kv == {
        "kv_connector": vllm_compat.CPU_CONNECTOR,
        "kv_connector_module_path": vllm_compat.CPU_CONNECTOR_MODULE,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str((tmp_path / "s").absolute())},
    }
    assert "--no-enable-prefix-caching" in ext.serve_argv(8000)
    assert ext.dtype == cfg.model.dtype
    regen = build_engine(cfg, _spec(), tmp_path, "regenerate")
    argv = regen.serve_argv(8000)
    assert argv[argv.index("--generation-config") + 1] == "vllm"


def test_cuda_profile_has_no_cpu_workarounds_and_real_parallel_sizes(tmp_path):
    cfg = _cfg("hardware=rtx_pro_6000_x8", "model.dtype=bfloat16")
    eng = build_engine(
        cfg, _spec(rope_type="default"), "moonshotai/Kimi-K2.5", "validate", draft_dir=tmp_path, k=3
    )
    argv = eng.serve_argv(8011)
    assert eng.env == {} and eng.compilation_config is None and "--enforce-eager" not in argv
    assert argv[argv.index("--tensor-parallel-size") + 1] == str(
        cfg.hardware.serving.tensor_parallel_size
    )
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    ext = build_engine(cfg, _spec(), "moonshotai/Kimi-K2.5", "extract", staging=tmp_path)
    assert ext.kv_transfer_config is not None
    assert ext.kv_transfer_config.kv_connector == vllm_compat.UPSTREAM_CONNECTOR
    assert "kv_connector_module_path" not in ext.llm_kwargs()["kv_transfer_config"]


def test_plain_rope_mla_targets_get_the_rotary_op_disabled_on_cpu_only(tmp_path):
    cfg = _cfg()
    eng = build_engine(cfg, _spec(rope_type="default"), tmp_path, "baseline", dtype="float32")
    assert eng.compilation_config is not None
    assert eng.compilation_config.custom_ops == ["-rotary_embedding"]
    argv = eng.serve_argv(1)
    assert json.loads(argv[argv.index("--compilation-config") + 1]) == {
        "custom_ops": ["-rotary_embedding"]
    }
    llama = _spec(attention="standard", rope_type="default")
    assert (
        build_engine(cfg, llama, tmp_path, "validate", draft_dir=tmp_path, k=1).compilation_config
        is None
    )


def test_engine_refuses_missing_pieces(tmp_path):
    with pytest.raises(ValueError, match="no dtype"):
        build_engine(load_config([], conf_dir=REPO / "conf"), _spec(), tmp_path, "baseline")
    cfg = _cfg()
    with pytest.raises(ValueError, match="draft_dir and k"):
        build_engine(cfg, _spec(), tmp_path, "validate")
    with pytest.raises(ValueError, match="staging"):
        build_engine(cfg, _spec(), tmp_path, "extract")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        build_engine(cfg, _spec(), tmp_path, "validate", draft_dir=tmp_path, k=0)


# Workaround 5 (compat.vllm), each branch: what the platform reports -> the engine asked of
# vLLM. Columns: build (cpu: the CPU build), the target's attention, the draft (None: no
# draft; "mla" / "llama": its layer), dtype -> the target's --attention-backend,
# VLLM_MLA_DISABLE set, the speculative config's attention_backend (the draft's).
ENGINE_CASES = [
    # an MLA draft in float32 on the CPU build: both models ask for CPU_MLA (issue 47:
    # without the draft's own request an AMX CPU gave the draft AMX_MLA, which refuses
    # float32)
    ("cpu", "mla", "mla", "float32", "CPU_MLA", False, "CPU_MLA"),
    ("cpu", "mla", "mla", "bfloat16", None, False, None),  # both: vLLM picks (one block size)
    # a llama draft on an MLA target: MLA off for the target (workaround 1), and the draft's
    # attention is not MLA, so neither asks for CPU_MLA
    ("cpu", "mla", "llama", "float32", None, True, None),
    ("cpu", "mla", "llama", "bfloat16", None, True, None),
    ("cpu", "mla", None, "float32", "CPU_MLA", False, None),  # target alone
    ("cpu", "mla", None, "bfloat16", None, False, None),
    ("cpu", "standard", "llama", "float32", None, False, None),
    ("cpu", "standard", None, "float32", None, False, None),
    # GPUs: vLLM's own choices, every one
    ("cuda", "mla", "mla", "float32", None, False, None),
    ("cuda", "mla", "llama", "float32", None, False, None),
    ("cuda", "mla", None, "float32", None, False, None),
]


@pytest.mark.parametrize(
    "build, target_attention, draft, dtype, target_backend, mla_off, draft_backend",
    ENGINE_CASES,
)
def test_each_model_asks_for_cpu_mla_in_float32_whatever_cpu_the_machine_has(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    build: str,
    target_attention: str,
    draft: str | None,
    dtype: str,
    target_backend: str | None,
    mla_off: bool,
    draft_backend: str | None,
) -> None:
    """The target's and the draft's attention backend follow one rule (CPU build, float32,
    that model's attention MLA => CPU_MLA), in the served and the offline forms; the engine
    is the same whether the platform reports AMX tiles or not (the rule reads no CPU: vLLM
    uses CPU_MLA on a CPU without AMX anyway), so this machine's CPU decides nothing here."""
    import torch

    cfg = _cfg("hardware=rtx_pro_6000_x8") if build == "cuda" else _cfg()
    spec = _spec(attention=target_attention, rope_type="yarn")
    draft_dir = tmp_path / "draft"
    kw: dict[str, Any] = {}
    if draft is None:
        purpose = "baseline"
    else:
        purpose = "validate"
        kw = dict(draft_dir=draft_dir, k=3, draft_mla=draft == "mla")
    engines = []
    for amx in (True, False):
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda amx=amx: amx)
        engines.append(build_engine(cfg, spec, tmp_path, purpose, dtype=dtype, **kw))
    with_amx, without_amx = engines
    assert with_amx == without_amx
    eng = with_amx
    argv = eng.serve_argv(8011)
    assert eng.attention_backend == target_backend
    got = argv[argv.index("--attention-backend") + 1] if "--attention-backend" in argv else None
    assert got == target_backend
    assert eng.llm_kwargs().get("attention_backend") == target_backend
    assert ("VLLM_MLA_DISABLE" in eng.env) == mla_off
    if draft is None:
        assert eng.speculative_config is None
        return
    served = json.loads(argv[argv.index("--speculative-config") + 1])
    offline = eng.llm_kwargs()["speculative_config"]
    assert served == offline
    assert served.get("attention_backend") == draft_backend
    assert "attention_backend" in served or draft_backend is None  # unset: left out
    assert served["method"] == "eagle3" and served["num_speculative_tokens"] == 3


def test_the_draft_layer_is_read_from_its_config_when_not_given(tmp_path: Path) -> None:
    """``draft_mla`` unset: an MLA draft is told by its config (``kv_lora_rank``, as vLLM
    serves it), so validation, serving and the benchmarks, which pass only the draft's
    directory, get the draft's CPU_MLA too; a llama draft's config gets none."""
    cfg = _cfg()
    mla, llama = tmp_path / "mla", tmp_path / "llama"
    mla.mkdir()
    llama.mkdir()
    (mla / "config.json").write_text(json.dumps({"model_type": "deepseek_v2", "kv_lora_rank": 512}))
    (llama / "config.json").write_text(
        json.dumps({"transformer_layer_config": {"model_type": "llama"}})
    )
    got = {}
    for name, d in (("mla", mla), ("llama", llama)):
        eng = build_engine(cfg, _spec(), tmp_path, "validate", dtype="float32", draft_dir=d, k=3)
        assert eng.speculative_config is not None
        got[name] = (eng.speculative_config.attention_backend, eng.attention_backend)
    assert got == {"mla": ("CPU_MLA", "CPU_MLA"), "llama": (None, None)}
