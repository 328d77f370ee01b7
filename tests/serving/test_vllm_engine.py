"""The one vLLM engine builder: every purpose gets the dtype, the parallel sizes and the
CPU-build workarounds from one place, and the served and offline forms agree."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from eagle3_pipeline.compat import vllm as vllm_compat
from eagle3_pipeline.core.config import load_config
from eagle3_pipeline.serving.engine import build_engine
from eagle3_pipeline.targets.adapter import TargetSpec

REPO = Path(__file__).resolve().parents[2]


def _spec(**kw) -> TargetSpec:
    base: dict[str, Any] = dict(
        name="t",
        model_type="kimi_k25",
        architecture="KimiK25ForConditionalGeneration",
        vllm_architecture="KimiK25ForConditionalGeneration",
        vllm_eagle3_supported=True,
        nested=True,
        text_config_key="text_config",
        text_model_type="deepseek_v3",
        num_layers=4,
        hidden_size=128,
        vocab_size=2048,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=96,
        intermediate_size=256,
        attention="mla",
        moe=True,
        num_experts=4,
        aux_layer_ids=[1, 2, 3],
        aux_layer_ids_source="adapter default",
        rope_type="yarn",
    )
    base.update(kw)
    return TargetSpec(**base)


def _cfg(*overrides: str):
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
    cfg = _cfg()
    with pytest.raises(ValueError, match="draft_dir and k"):
        build_engine(cfg, _spec(), tmp_path, "validate")
    with pytest.raises(ValueError, match="staging"):
        build_engine(cfg, _spec(), tmp_path, "extract")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        build_engine(cfg, _spec(), tmp_path, "validate", draft_dir=tmp_path, k=0)
