"""Each workaround in eagle3_pipeline.compat.vllm exists because of a bug or gap in the
installed vLLM. These tests run that vLLM and FAIL once the bug is fixed upstream: then
the workaround (and this test) can go."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_helpers import run_in_vllm

from eagle3_pipeline.compat import vllm as vllm_compat

pytestmark = pytest.mark.slow


def test_cpu_rotary_kernel_is_still_wrong_for_mla_3d_input():
    """Workaround 2: ``RotaryEmbedding.forward_cpu`` on ``[tokens, heads, 64]`` queries
    (what MLA passes) differs from the native path; on flattened 2-D input it is exact."""
    res = run_in_vllm("""
        import json, torch
        from vllm.config import VllmConfig, set_current_vllm_config
        from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
        torch.manual_seed(0)
        with set_current_vllm_config(VllmConfig()):
            rope = RotaryEmbedding(64, 64, 256, 10000.0, False, torch.float32)
        pos = torch.arange(7)
        q, k = torch.randn(7, 4, 64), torch.randn(7, 1, 64)
        n3 = rope.forward_native(pos, q.clone(), k.clone())[0]
        c3 = rope.forward_cpu(pos, q.clone(), k.clone())[0]
        n2 = rope.forward_native(pos, q.reshape(7, -1).clone(), k.reshape(7, -1).clone())[0]
        c2 = rope.forward_cpu(pos, q.reshape(7, -1).clone(), k.reshape(7, -1).clone())[0]
        print(json.dumps({"d3": (n3 - c3).abs().max().item(), "d2": (n2 - c2).abs().max().item()}))
    """)
    assert res.returncode == 0, res.stderr[-3000:]
    diff = json.loads(res.stdout.strip().splitlines()[-1])
    assert diff["d2"] < 1e-5, diff  # the kernel itself is right on 2-D input
    assert diff["d3"] > 1e-2, (
        f"vLLM's CPU rotary kernel now handles 3-D input: {diff}; "
        "drop vllm_compat.rotary_op_disabled"
    )
    assert vllm_compat.rotary_op_disabled(True, True, "default")
    assert not vllm_compat.rotary_op_disabled(True, True, "yarn")
    assert not vllm_compat.rotary_op_disabled(False, True, "default")


def test_upstream_hidden_states_connector_still_needs_cuda():
    """Workaround 3: the upstream connector copies through a CUDA stream into pinned
    memory, which the CPU build cannot do."""
    res = run_in_vllm("""
        import inspect, json, torch
        from vllm.distributed.kv_transfer.kv_connector.v1 import example_hidden_states_connector as m
        src = inspect.getsource(m.ExampleHiddenStatesConnector._submit_async_write)
        try:
            torch.empty(2, pin_memory=True)
            pinned = "ok"
        except Exception as exc:
            pinned = str(exc)
        print(json.dumps({"cuda_stream": "torch.cuda" in src, "pin_memory": "pin_memory=True" in src,
                          "pinned": pinned}))
    """)
    assert res.returncode == 0, res.stderr[-3000:]
    facts = json.loads(res.stdout.strip().splitlines()[-1])
    assert facts["cuda_stream"] and facts["pin_memory"], facts
    assert facts["pinned"] != "ok", "pinned memory works here now: try the upstream connector"


def test_mla_with_an_eagle3_draft_still_fails_to_start_on_cpu(validate_workdir: Path):
    """Workaround 1: with MLA enabled, target + EAGLE-3 draft cannot start on the CPU
    build (no common KV block size for CPU_MLA and the draft's attention)."""
    model = validate_workdir / "data" / "target" / "model"
    draft = validate_workdir / "data" / "draft"
    res = run_in_vllm(
        f"""
        from vllm import LLM
        if __name__ == "__main__":
            try:
                LLM(model={str(model)!r}, dtype="float32", max_model_len=512, enforce_eager=True,
                    attention_backend="CPU_MLA",  # workaround 5 (AMX_MLA refuses float32)
                    speculative_config={{"method": "eagle3", "model": {str(draft)!r},
                                        "num_speculative_tokens": 3}})
                print("STARTED")
            except Exception as exc:
                print("FAILED", exc)
    """,
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    out = res.stdout + res.stderr
    assert "STARTED" not in res.stdout, (
        "MLA + EAGLE-3 starts on CPU now: drop vllm_compat.mla_disabled"
    )
    assert "No common block size" in out or "block size" in out.lower(), out[-3000:]


def _amx() -> bool:
    import torch

    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


@pytest.mark.skipif(not _amx(), reason="this CPU has no AMX tiles: vLLM picks CPU_MLA itself")
def test_amx_mla_still_refuses_a_float32_target(validate_workdir: Path):
    """Workaround 5: on an AMX CPU vLLM's default MLA backend cannot load float32 weights,
    while the reference backend we request can."""
    model = validate_workdir / "data" / "target" / "model"
    code = """
        from vllm import LLM
        if __name__ == "__main__":
            try:
                LLM(model={model!r}, dtype="float32", max_model_len=512, enforce_eager=True{extra})
                print("STARTED")
            except Exception as exc:
                print("FAILED", exc)
    """
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    default = run_in_vllm(code.format(model=str(model), extra=""), env=env)
    assert "STARTED" not in default.stdout, (
        "AMX_MLA loads float32 now: drop vllm_compat.mla_backend"
    )
    assert "expect weight to be bfloat16" in default.stdout + default.stderr
    chosen = run_in_vllm(
        code.format(model=str(model), extra=', attention_backend="CPU_MLA"'), env=env
    )
    assert "STARTED" in chosen.stdout, (chosen.stdout + chosen.stderr)[-3000:]


def test_vllm_reads_every_eagle31_option_the_schema_offers():
    """The installed vLLM's own speculators-config reader carries norm_before_fc, fc_norm
    and norm_output into the draft's config (preflight refuses an option it would drop);
    fails when a vLLM upgrade stops reading one."""
    from eagle3_pipeline.serving.env import _eagle3_options, find_python

    assert _eagle3_options(find_python(), 300.0) == list(vllm_compat.EAGLE3_DRAFT_OPTIONS)


def test_vllm_serves_every_draft_layer_type_we_offer():
    """vLLM's speculators-config reader maps each of ``draft.layers``' types to a draft
    architecture in its model registry; fails when it stops serving one."""
    from eagle3_pipeline.draft.layers import DRAFT_LAYERS

    res = run_in_vllm(f"""
        import json
        from vllm.model_executor.models.registry import ModelRegistry
        from vllm.transformers_utils.configs.speculators.algos import SUPPORTED_SPECULATORS_TYPES
        out = {{}}
        for name in {list(DRAFT_LAYERS)!r}:
            cfg = {{"model_type": name}}
            try:
                SUPPORTED_SPECULATORS_TYPES["eagle3"]({{}}, cfg)
            except ValueError:
                out[name] = None
                continue
            arch = cfg["architectures"][0]
            out[name] = arch if arch in ModelRegistry.get_supported_archs() else None
        print(json.dumps(out))
    """)
    assert res.returncode == 0, res.stderr[-3000:]
    archs = json.loads(res.stdout.strip().splitlines()[-1])
    assert all(archs.values()), f"vLLM no longer serves these draft layer types: {archs}"


def test_the_targets_we_call_eagle3_capable_are_vllms_own():
    """``targets.adapter.VLLM_EAGLE3_TARGETS`` (what target.json reports and preflight
    trusts) against the installed vLLM: each is a registered architecture whose class
    supports EAGLE-3's aux hidden states. Fails when vLLM drops or renames one."""
    from eagle3_pipeline.targets.adapter import VLLM_EAGLE3_TARGETS

    # A multimodal class may not import on a CPU host: then its module's source says
    # whether the class declares SupportsEagle3.
    res = run_in_vllm(f"""
        import ast, importlib.util, json
        from vllm.model_executor.models.interfaces import supports_eagle3
        from vllm.model_executor.models.registry import ModelRegistry
        out = {{}}
        for arch in {sorted(VLLM_EAGLE3_TARGETS)!r}:
            cls = ModelRegistry._try_load_model_cls(arch)
            if cls is not None:
                out[arch] = bool(supports_eagle3(cls))
                continue
            lazy = ModelRegistry.models.get(arch)
            spec = lazy and importlib.util.find_spec(lazy.module_name)
            tree = ast.parse(open(spec.origin).read()) if spec else ast.Module(body=[])
            out[arch] = any(isinstance(n, ast.ClassDef) and n.name == lazy.class_name
                            and "SupportsEagle3" in ast.unparse(n.bases) for n in tree.body)
        print(json.dumps(out))
    """)
    assert res.returncode == 0, res.stderr[-3000:]
    found = json.loads(res.stdout.strip().splitlines()[-1])
    assert all(found.values()), f"not EAGLE-3 targets in this vLLM: {found}"
