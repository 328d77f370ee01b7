"""The target-family registry: discovery, lookup, MoE layouts, and the tiny Qwen3-MoE."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from eagle3_pipeline.core.choices import TinyArchitecture
from eagle3_pipeline.core.config import ConfigError, ModelConfig, check_tiny_architecture
from eagle3_pipeline.targets import families
from eagle3_pipeline.targets.adapter import VLLM_EAGLE3_TARGETS, describe_config
from eagle3_pipeline.targets.families import (
    FAMILIES,
    GENERIC,
    family_for_config,
    get_family,
)
from eagle3_pipeline.targets.families.base import (
    any_layout,
    first_k_dense_layout,
    interleaved_layout,
    sparse_step_layout,
)

REPO = Path(__file__).resolve().parents[2]
QWEN3_MOE = REPO / "tests" / "fixtures" / "qwen3_30b_a3b"
KIMI = REPO / "tests" / "fixtures" / "kimi_k25"


# --------------------------------------------------------------------------- registry


def test_every_family_module_is_discovered_under_its_own_name():
    assert set(FAMILIES) == {"deepseek_v3", "kimi_k25", "llama", "qwen3", "qwen3_moe"}
    for name, family in FAMILIES.items():
        assert family.name == name
        if family.tiny is not None:  # selectable as model=tiny_<name>
            assert (REPO / "conf" / "model" / f"tiny_{name}.yaml").is_file(), name
    claimed = [t for f in FAMILIES.values() for t in f.model_types]
    assert len(claimed) == len(set(claimed))


def test_a_new_family_is_one_module(tmp_path, monkeypatch):
    """Dropping a module into the package registers it; no list to edit."""
    (tmp_path / "mistral.py").write_text(
        "from eagle3_pipeline.targets.families.base import Family\n"
        "FAMILY = Family(name='mistral', model_types=('mistral',),\n"
        "                architectures=('MistralForCausalLM',))\n"
    )
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(tmp_path)])
    try:
        found = families._discover()
    finally:
        sys.modules.pop("eagle3_pipeline.targets.families.mistral", None)
    assert found["mistral"].matches({"model_type": "mistral"})
    assert set(found) - {"mistral"} == set(FAMILIES)


def test_lookup_by_name_model_type_and_architecture():
    assert get_family("qwen3_moe").vllm_architecture == "Qwen3MoeForCausalLM"
    with pytest.raises(ConfigError, match="unknown model family 'gpt2'"):
        get_family("gpt2")
    assert family_for_config({"model_type": "kimi_k25"}).name == "kimi_k25"
    assert family_for_config({"architectures": ["Qwen3MoeForCausalLM"]}).name == "qwen3_moe"
    assert family_for_config({"model_type": "gpt2"}) is GENERIC


def test_the_tiny_architectures_are_the_families_with_a_tiny_builder():
    """The config checks ``model.tiny.architecture`` against its own Enum (core is below
    the targets); the registry's tiny builders are the one truth it must match."""
    buildable = [name for name, f in FAMILIES.items() if f.tiny is not None]
    assert buildable == [a.value for a in TinyArchitecture]


def test_only_families_with_a_tiny_builder_are_buildable():
    check_tiny_architecture("qwen3_moe")
    with pytest.raises(ConfigError, match="is not one of kimi_k25, llama, qwen3_moe"):
        check_tiny_architecture("qwen3")


def test_a_tiny_architecture_without_a_builder_fails_composing_in_one_line():
    from eagle3_pipeline.core.config import load_config

    with pytest.raises(ConfigError) as err:
        load_config(["model.tiny.architecture=qwen3"], conf_dir=REPO / "conf")
    line = str(err.value)
    assert "\n" not in line and "model.tiny.architecture" in line
    assert "'qwen3', expected one of [kimi_k25, llama, qwen3_moe]" in line


def test_the_unions_the_generic_code_reads_cover_every_family():
    """What the generic code looks for (reasoning markers, decoder-layer and final-norm
    attribute names) holds every registered family's own entries, once each."""
    for union, of in (
        (families.reasoning_markers(), lambda f: f.reasoning_markers),
        (families.decoder_layers_attrs(), lambda f: f.decoder_layers_attrs),
        (families.final_norm_attrs(), lambda f: f.final_norm_attrs),
    ):
        assert len(set(union)) == len(union), union
        for f in FAMILIES.values():
            assert set(of(f)) <= set(union), (f.name, of(f), union)
    for f in FAMILIES.values():
        if f.vllm_architecture and f.vllm_eagle3:
            assert f.vllm_architecture in VLLM_EAGLE3_TARGETS, f.name


# --------------------------------------------------------------------------- MoE layouts


def _moe(layout, text: dict, n: int) -> list[int]:
    return [i for i in range(n) if layout(text, i)]


def test_deepseek_layout_first_k_dense_then_every_freq():
    assert _moe(first_k_dense_layout, {"first_k_dense_replace": 1}, 61) == list(range(1, 61))
    assert _moe(first_k_dense_layout, {"first_k_dense_replace": 1, "moe_layer_freq": 2}, 6) == [
        2,
        4,
    ]


def test_qwen_moe_layout_sparse_step_and_mlp_only_layers():
    assert _moe(sparse_step_layout, {"decoder_sparse_step": 1}, 4) == [0, 1, 2, 3]
    assert _moe(sparse_step_layout, {"decoder_sparse_step": 2}, 8) == [1, 3, 5, 7]
    assert _moe(sparse_step_layout, {"decoder_sparse_step": 1, "mlp_only_layers": [0, 2]}, 4) == [
        1,
        3,
    ]


def test_llama4_layout_interleave_step_or_explicit_list():
    assert _moe(interleaved_layout, {"interleave_moe_layer_step": 2}, 6) == [1, 3, 5]
    assert _moe(interleaved_layout, {"interleave_moe_layer_step": 1}, 3) == [0, 1, 2]
    assert _moe(interleaved_layout, {"moe_layers": [0, 5]}, 6) == [0, 5]


def test_an_unregistered_family_gets_the_layout_its_keys_name():
    # the weight estimate used to count these as all-MoE
    assert _moe(any_layout, {"decoder_sparse_step": 2}, 4) == [1, 3]
    assert _moe(any_layout, {"interleave_moe_layer_step": 4}, 8) == [3, 7]
    assert _moe(any_layout, {"first_k_dense_replace": 3}, 5) == [3, 4]
    qwen2_moe = {"model_type": "qwen2_moe", "num_experts": 60, "decoder_sparse_step": 2}
    assert family_for_config(qwen2_moe).moe_layers(qwen2_moe, 4) == [1, 3]


# --------------------------------------------------------------------------- describe


def test_describe_the_real_qwen3_30b_a3b_config():
    config = json.loads((QWEN3_MOE / "config.json").read_text())
    spec = describe_config(config, ModelConfig(name="q", tiny=None, path=str(QWEN3_MOE)))
    assert spec.model_type == "qwen3_moe" and not spec.nested
    assert spec.moe and spec.num_experts == 128 and spec.attention == "standard"
    assert spec.vllm_architecture == "Qwen3MoeForCausalLM" and spec.vllm_eagle3_supported
    assert (spec.num_layers, spec.hidden_size, spec.head_dim) == (48, 2048, 128)
    assert spec.aux_layer_ids == [2, 24, 45]
    # transformers 5 writes the expert count as num_local_experts
    config["num_local_experts"] = config.pop("num_experts")
    assert describe_config(config, ModelConfig(name="q", tiny=None, path="x")).num_experts == 128


def test_kimi_weight_names_resolve_through_its_family():
    spec = describe_config(
        json.loads((KIMI / "config.json").read_text()),
        ModelConfig(name="k", tiny=None, path=str(KIMI)),
        [
            "language_model.model.embed_tokens.weight",
            "language_model.model.layers.0.mlp.gate_proj.weight",
            "language_model.model.norm.weight",
            "language_model.lm_head.weight",
        ],
    )
    assert spec.weight_prefix == "language_model.model."
    assert spec.weights["lm_head"] == "language_model.lm_head.weight"


# --------------------------------------------------------------------------- tiny Qwen3-MoE


@pytest.fixture(scope="module")
def tiny_qwen3_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory holding data/target/ for the tiny Qwen3-MoE (30 train steps)."""
    from conftest import build_target_workdir

    return build_target_workdir(tmp_path_factory.mktemp("tiny_qwen3_moe"), "model=tiny_qwen3_moe")


def test_tiny_qwen3_moe_is_described_as_a_moe_vllm_target(tiny_qwen3_moe):
    from eagle3_pipeline.targets.adapter import load_target_spec

    spec = load_target_spec(tiny_qwen3_moe / "data/target/target.json")
    assert spec.model_type == "qwen3_moe" and not spec.nested
    assert spec.architecture == spec.vllm_architecture == "Qwen3MoeForCausalLM"
    assert spec.vllm_eagle3_supported and spec.moe and spec.num_experts == 4
    assert spec.attention == "standard" and spec.num_key_value_heads == 2 and spec.head_dim == 32
    assert spec.weights == {
        "embed_tokens": "model.embed_tokens.weight",
        "lm_head": "lm_head.weight",
        "final_norm": "model.norm.weight",
    }
    assert spec.aux_layer_ids == [1, 2, 3] and spec.chat_template


def test_tiny_qwen3_moe_alternates_dense_and_moe_layers_under_vllms_names(tiny_qwen3_moe):
    spec = json.loads((tiny_qwen3_moe / "data/target/target.json").read_text())
    model_dir = tiny_qwen3_moe / spec["path"]
    config = json.loads((model_dir / "config.json").read_text())
    assert config["decoder_sparse_step"] == 2 and config["mlp_only_layers"] == []
    names = set(json.loads((model_dir / "model.safetensors.index.json").read_text())["weight_map"])
    for layer in (1, 3):  # MoE: a router and per-expert MLPs, as vLLM's loader expects
        assert f"model.layers.{layer}.mlp.gate.weight" in names
        for e in range(4):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                assert f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight" in names
    for layer in (0, 2):  # dense
        assert f"model.layers.{layer}.mlp.gate_proj.weight" in names
        assert not any(n.startswith(f"model.layers.{layer}.mlp.experts.") for n in names)
    assert "model.layers.0.self_attn.q_norm.weight" in names


def test_the_plan_counts_the_tiny_qwen3_moe_it_builds(tiny_qwen3_moe):
    """The plan's config (from the shape, nothing built) and weight count match the model."""
    from eagle3_pipeline.core.config import load_config
    from eagle3_pipeline.plan.target_info import load_target
    from eagle3_pipeline.tools.plan.weights import estimate_target_weights

    planned = load_target(load_config(["model=tiny_qwen3_moe"], conf_dir=REPO / "conf").model)
    metrics = json.loads((tiny_qwen3_moe / "metrics/details/target.json").read_text())
    assert metrics["architecture"] == "Qwen3MoeForCausalLM" and metrics["reload_logits_identical"]
    assert planned.spec.vocab_size == metrics["vocab_size"]
    assert estimate_target_weights(planned).params == metrics["parameters"]


def test_tiny_qwen3_moe_language_model_loads_for_extraction(tiny_qwen3_moe):
    from eagle3_pipeline.targets.adapter import load_target_spec
    from eagle3_pipeline.targets.loading import load_language_model

    spec = load_target_spec(tiny_qwen3_moe / "data/target/target.json")
    lm = load_language_model(spec, tiny_qwen3_moe / spec.path, "float32")
    assert len(lm.layers) == 4
    kinds = [type(layer.mlp).__name__ for layer in lm.layers]
    assert kinds == ["Qwen3MoeMLP", "Qwen3MoeSparseMoeBlock"] * 2
