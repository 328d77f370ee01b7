"""The checkpoint validator against real checkpoints written by speculators' own code.

The base draft is built and saved once per module by speculators 0.9 itself (its
training checkpointer, bf16, as ``speculators.train`` writes it) for a tiny Llama target
saved with transformers; every broken case is a copy of it with exactly one defect, and
each test asserts the specific finding -- so a rule that stops firing fails here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from loader_rules import RULES, LoaderRule, apply
from safetensors.torch import load_file, save_file

from eagle3_pipeline.core.config import ModelConfig
from eagle3_pipeline.core.io import atomic_write_json
from eagle3_pipeline.targets.adapter import TargetSpec, describe_target
from eagle3_pipeline.validate.checkpoint import Report, validate_checkpoint

# every rule is checked on real drafts built with speculators' classes (the `built` fixtures)
pytestmark = pytest.mark.integration

HIDDEN = 64
VOCAB = 300
DRAFT_VOCAB = 128
AUX = [1, 2, 3]
K = 3


@dataclasses.dataclass
class Built:
    target_dir: Path
    spec: TargetSpec
    draft_dir: Path  # written by speculators' training checkpointer
    model: Any  # the Eagle3DraftModel it was saved from


def build_target(path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(cfg).save_pretrained(path)


def build_draft(target_dir: Path, verifier_id: str | None = None) -> Any:
    """An Eagle3DraftModel built with speculators' config classes, as its trainer does."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution
    from transformers import LlamaConfig

    layer = LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=256,
    )
    layer._attn_implementation = "sdpa"
    verifier = VerifierConfig.from_pretrained(str(target_dir))
    if verifier_id is not None:
        verifier.name_or_path = verifier_id
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=DRAFT_VOCAB,
        norm_before_residual=True,
        eagle_aux_hidden_state_layer_ids=list(AUX),
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=K)],
            default_proposal_method="greedy",
            verifier=verifier,
        ),
    )
    torch.manual_seed(1)
    model = Eagle3DraftModel(config)
    # a synthetic token distribution: every third id, most frequent first
    freq = {i: 10_000 - i for i in range(0, VOCAB, 3)}
    freq.update({i: 1 for i in range(1, VOCAB, 3)})
    d2t, t2d = build_vocab_mappings_from_distribution(freq, DRAFT_VOCAB, VOCAB)
    model.load_vocab_mappings(t2d, d2t)
    # verifier weights come from the local target directory
    model.config.speculators_config.verifier.name_or_path = str(target_dir)
    model.load_verifier_weights()
    model.config.speculators_config.verifier.name_or_path = verifier.name_or_path
    return model


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    from speculators.train.checkpointer import SingleGPUCheckpointer

    root = tmp_path_factory.mktemp("ckpt")
    target_dir = root / "target"
    build_target(target_dir)
    spec = describe_target(
        target_dir, ModelConfig(name="tiny_llama", path=str(target_dir), aux_layer_ids=AUX)
    )
    model = build_draft(target_dir)
    ckpt = SingleGPUCheckpointer(root / "train")
    ckpt.save_checkpoint(model, torch.optim.AdamW(model.parameters()), 0)
    return Built(target_dir, spec, root / "train" / "0", model)


def build_mla_draft(target_dir: Path) -> Any:
    """An Eagle3DraftModel with this pipeline's MLA layer (draft/mla.py) over the tiny Llama
    target: the validator's MLA rules read the saved form, not the target's attention."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    from eagle3_pipeline.draft import mla

    mla.register()
    layer = mla.layer_config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_layers=1,
        num_attention_heads=4,
        q_lora_rank=16,
        kv_lora_rank=32,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        v_head_dim=8,
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
        rope={"rope_theta": 10000.0},
    )
    layer.num_aux_hidden_states = len(AUX)
    layer._attn_implementation = "sdpa"
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=DRAFT_VOCAB,
        norm_before_residual=True,
        eagle_aux_hidden_state_layer_ids=list(AUX),
        target_hidden_size=HIDDEN,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=K)],
            default_proposal_method="greedy",
            verifier=VerifierConfig.from_pretrained(str(target_dir)),
        ),
    )
    torch.manual_seed(1)
    model = Eagle3DraftModel(config)
    freq = {i: 10_000 - i for i in range(0, VOCAB, 3)}
    d2t, t2d = build_vocab_mappings_from_distribution(freq, DRAFT_VOCAB, VOCAB)
    model.load_vocab_mappings(t2d, d2t)
    model.load_verifier_weights()
    return model


@pytest.fixture(scope="module")
def built_mla(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """An MLA draft saved as the train stage saves it (vLLM's plain DeepSeek config)."""
    from eagle3_pipeline.train.save import save_draft

    out = tmp_path_factory.mktemp("mla") / "draft"
    model = build_mla_draft(built.target_dir)
    save_draft(model, out, K)
    return Built(built.target_dir, built.spec, out, model)


def variant(
    built: Built,
    tmp_path: Path,
    config: Callable[[dict[str, Any]], None] | None = None,
    tensors: Callable[[dict[str, torch.Tensor]], object] | None = None,
) -> Path:
    """A copy of the base draft with one defect applied to its config and/or tensors."""
    out = tmp_path / "draft"
    shutil.copytree(built.draft_dir, out)
    if config is not None:
        data = json.loads((out / "config.json").read_text())
        config(data)
        (out / "config.json").write_text(json.dumps(data, indent=2))
    if tensors is not None:
        sd = load_file(out / "model.safetensors")
        tensors(sd)
        sd = {k: v.contiguous() for k, v in sd.items()}
        save_file(sd, out / "model.safetensors", metadata={"format": "pt"})
    return out


def errors(report: Report, code: str) -> list[str]:
    return [f.where for f in report.errors if f.code == code]


def check(path: Path, built: Built, **kw: Any) -> Report:
    kw.setdefault("reload", False)
    return validate_checkpoint(path, built.spec, **kw)


# --------------------------------------------------------------------------- passes


def test_speculators_training_checkpoint_passes_with_reload(built: Built) -> None:
    report = validate_checkpoint(built.draft_dir, built.spec)
    assert report.ok, report.format()
    assert report.warnings == [], report.format()
    assert "reload" in report.codes("info"), report.format()
    assert report.facts["aux_layer_ids"] == AUX
    assert report.facts["dtype"] == "BF16"
    cmd = report.serve_command or ""
    assert cmd.startswith(f"vllm serve {built.target_dir} --speculative-config ")
    assert '"method":"eagle3"' in cmd and f'"num_speculative_tokens":{K}' in cmd


def test_sharded_checkpoint_passes_and_broken_index_fails(built: Built, tmp_path: Path) -> None:
    sharded = tmp_path / "sharded"
    built.model.save_pretrained(sharded, max_shard_size="40KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    report = check(sharded, built)
    assert report.ok, report.format()

    shard = index["weight_map"]["fc.weight"]
    (sharded / shard).unlink()
    report = check(sharded, built)
    assert shard in errors(report, "weights-index")
    assert "fc.weight" in errors(report, "tensor-missing")


def test_midlayer_names_are_renamed_like_vllm(built: Built, tmp_path: Path) -> None:
    def rename(sd: dict[str, torch.Tensor]) -> None:
        for name in [n for n in sd if n.startswith("layers.0.")]:
            sd[name.replace("layers.0.", "midlayer.")] = sd.pop(name)

    report = check(variant(built, tmp_path, tensors=rename), built)
    assert report.ok, report.format()
    assert "tensor-renamed" in report.codes("info")


def test_published_hub_id_passes_and_reloads_offline(built: Built, tmp_path: Path) -> None:
    spec = dataclasses.replace(built.spec, hub_id="example-org/tiny-llama")

    def set_id(c: dict[str, Any]) -> None:
        c["speculators_config"]["verifier"]["name_or_path"] = "example-org/tiny-llama"

    report = validate_checkpoint(variant(built, tmp_path, config=set_id), spec)
    assert report.ok, report.format()
    assert "reload" in report.codes("info")


# --------------------------------------------------------------------------- weights


def test_missing_tensor(built: Built, tmp_path: Path) -> None:
    path = variant(built, tmp_path, tensors=lambda sd: sd.pop("layers.0.hidden_norm.weight"))
    assert errors(check(path, built), "tensor-missing") == ["layers.0.hidden_norm.weight"]


def test_wrong_shape(built: Built, tmp_path: Path) -> None:
    def shrink(sd: dict[str, torch.Tensor]) -> None:
        sd["layers.0.self_attn.q_proj.weight"] = sd["layers.0.self_attn.q_proj.weight"][:, :HIDDEN]

    where = errors(check(variant(built, tmp_path, tensors=shrink), built), "tensor-shape")
    assert where == ["model.safetensors:layers.0.self_attn.q_proj.weight"]


@pytest.mark.parametrize(
    "name", ["layers.0.self_attn.k_proj.bias", "verifier_lm_head.weight", "layers.0.foo.weight"]
)
def test_unknown_tensor(built: Built, tmp_path: Path, name: str) -> None:
    def add(sd: dict[str, torch.Tensor]) -> None:
        sd[name] = torch.ones(4)

    where = errors(check(variant(built, tmp_path, tensors=add), built), "tensor-unknown")
    assert where == [f"model.safetensors:{name}"]


def test_rotary_buffers_are_dropped_like_vllm(built: Built, tmp_path: Path) -> None:
    """vLLM's AutoWeightsLoader drops saved rotary buffers by name: a warning, not a refusal."""
    name = "layers.0.self_attn.rotary_emb.inv_freq"

    def add(sd: dict[str, torch.Tensor]) -> None:
        sd[name] = torch.ones(4)

    report = check(variant(built, tmp_path, tensors=add), built)
    assert report.ok, report.format()
    assert [f.where for f in report.warnings if f.code == "tensor-unknown"] == [
        f"model.safetensors:{name}"
    ]


# --------------------------------------------------------------------------- vLLM's loaders


def test_mla_draft_passes_with_reload(built_mla: Built) -> None:
    report = validate_checkpoint(built_mla.draft_dir, built_mla.spec)
    assert report.ok, report.format()


@pytest.mark.parametrize("rule", RULES, ids=[r.id for r in RULES])
def test_what_vllms_loader_refuses_the_validator_refuses(
    built: Built, built_mla: Built, tmp_path: Path, rule: LoaderRule
) -> None:
    """Each defect of tests/support/loader_rules.py (the slow tier shows real vLLM refusing
    the same defects: tests/serving/test_vllm_loader_rules.py)."""
    base = built_mla if rule.layout == "mla" else built
    path = tmp_path / "draft"
    shutil.copytree(base.draft_dir, path)
    apply(rule, path)
    report = check(path, base)
    found = [f for f in report.errors if f.code == rule.code and rule.where in f.where]
    assert found, report.format()


def test_the_llama_loader_skips_what_the_mla_loader_refuses(built: Built, tmp_path: Path) -> None:
    """vLLM's llama draft drops input_norm (norm_before_fc off) and skips mask_hidden (no
    parallel drafting); its MLA draft refuses both (see the rules above)."""
    path = tmp_path / "draft"
    shutil.copytree(built.draft_dir, path)
    for rule in RULES:
        if rule.id in ("mla-input-norm", "mla-mask-hidden"):
            apply(rule, path)
    report = check(path, built)
    assert report.ok, report.format()
    assert [f.where for f in report.warnings if f.code == "tensor-unknown"] == [
        "model.safetensors:mask_hidden"
    ]
    assert "input-norm-dropped" in report.codes("warning")


def test_a_full_vocabulary_draft_without_d2t_passes(built_mla: Built, tmp_path: Path) -> None:
    """The form vLLM loads a whole-vocabulary draft in: no d2t (speculators saves none)."""

    def no_maps(config: dict[str, Any], sd: dict[str, torch.Tensor]) -> None:
        full = next(r for r in RULES if r.id == "mla-full-vocab-d2t")
        full.defect(config, sd)
        del sd["d2t"], sd["t2d"]

    path = tmp_path / "draft"
    shutil.copytree(built_mla.draft_dir, path)
    apply(no_maps, path)
    report = check(path, built_mla)
    assert report.ok, report.format()


def test_mla_aux_count_is_read_from_the_top_level(built_mla: Built, tmp_path: Path) -> None:
    """vLLM's MLA draft sizes fc for num_aux_hidden_states (top level), else for 3."""
    path = tmp_path / "draft"
    shutil.copytree(built_mla.draft_dir, path)
    config = json.loads((path / "config.json").read_text())
    config["num_aux_hidden_states"] = 2
    (path / "config.json").write_text(json.dumps(config))
    assert errors(check(path, built_mla), "aux-count") == ["config.json:num_aux_hidden_states"]


def test_d2t_must_be_int64(built: Built, tmp_path: Path) -> None:
    def to_int32(sd: dict[str, torch.Tensor]) -> None:
        sd["d2t"] = sd["d2t"].to(torch.int32)

    where = errors(check(variant(built, tmp_path, tensors=to_int32), built), "tensor-dtype")
    assert where == ["model.safetensors:d2t"]


def test_out_of_range_d2t(built: Built, tmp_path: Path) -> None:
    def push(sd: dict[str, torch.Tensor]) -> None:
        sd["d2t"][-1] = VOCAB  # last draft id -> beyond the target vocabulary

    report = check(variant(built, tmp_path, tensors=push), built)
    assert errors(report, "d2t-range") == ["d2t"]


def test_duplicate_d2t_targets(built: Built, tmp_path: Path) -> None:
    def dup(sd: dict[str, torch.Tensor]) -> None:
        sd["d2t"][1] = sd["d2t"][0] - 1  # draft ids 0 and 1 -> the same target id

    report = check(variant(built, tmp_path, tensors=dup), built)
    assert errors(report, "d2t-duplicate") == ["d2t"]


def test_nan_weights(built: Built, tmp_path: Path) -> None:
    def poison(sd: dict[str, torch.Tensor]) -> None:
        sd["fc.weight"][0, 0] = float("nan")
        sd["lm_head.weight"][3, 3] = float("inf")

    where = errors(check(variant(built, tmp_path, tensors=poison), built), "nonfinite")
    assert sorted(where) == ["model.safetensors:fc.weight", "model.safetensors:lm_head.weight"]


def test_values_located_across_dtypes_numpy_cannot_read(tmp_path: Path) -> None:
    # byte ranges are derived from offset order and sizes: a tensor stored after an fp8
    # one (no numpy dtype) must still be read at the right place.
    from eagle3_pipeline.validate.checkpoint.values import byte_ranges

    path = tmp_path / "model.safetensors"
    sd = {
        "a": torch.ones(5, dtype=torch.float8_e4m3fn),
        "b": torch.tensor([1.0, float("inf")], dtype=torch.bfloat16),
        "c": torch.arange(3, dtype=torch.int64),
        "d": torch.zeros(0),
    }
    save_file(sd, path)
    data = path.read_bytes()
    for name, (start, end) in byte_ranges(path).items():
        assert data[start:end] == sd[name].view(torch.uint8).numpy().tobytes(), name

    (tmp_path / "config.json").write_text("{}")
    report = validate_checkpoint(tmp_path, None, reload=False)
    assert errors(report, "nonfinite") == ["model.safetensors:b"]
    path.write_bytes(data[:-2])  # truncated: refused, not read past its end
    report = validate_checkpoint(tmp_path, None, reload=False)
    assert errors(report, "weights-unreadable") == ["model.safetensors"]
    assert not errors(report, "nonfinite")


def test_no_safetensors(built: Built, tmp_path: Path) -> None:
    path = variant(built, tmp_path)
    (path / "model.safetensors").unlink()
    assert errors(check(path, built), "weights-missing") == [str(path)]


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("keys", "where"),
    [
        (("speculators_model_type",), "speculators_model_type"),
        (("draft_vocab_size",), "draft_vocab_size"),
        (("transformer_layer_config", "hidden_size"), "transformer_layer_config.hidden_size"),
        (
            ("speculators_config", "verifier", "name_or_path"),
            "speculators_config.verifier.name_or_path",
        ),
    ],
)
def test_missing_required_field(
    built: Built, tmp_path: Path, keys: tuple[str, ...], where: str
) -> None:
    def drop(c: dict[str, Any]) -> None:
        for k in keys[:-1]:
            c = c[k]
        del c[keys[-1]]

    report = check(variant(built, tmp_path, config=drop), built)
    assert f"config.json:{where}" in errors(report, "field-missing"), report.format()


def test_missing_speculative_tokens_and_zero(built: Built, tmp_path: Path) -> None:
    def zero(c: dict[str, Any]) -> None:
        c["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 0

    report = check(variant(built, tmp_path, config=zero), built)
    assert errors(report, "speculative-tokens")
    assert report.serve_command is None


def test_wrong_field_type(built: Built, tmp_path: Path) -> None:
    def stringly(c: dict[str, Any]) -> None:
        c["draft_vocab_size"] = "128"

    assert errors(check(variant(built, tmp_path, config=stringly), built), "field-type") == [
        "config.json:draft_vocab_size"
    ]


def test_top_level_model_type_breaks_vllm_detection(built: Built, tmp_path: Path) -> None:
    report = check(variant(built, tmp_path, config=lambda c: c.update(model_type="llama")), built)
    assert errors(report, "vllm-detection") == ["config.json:model_type"]


def test_non_vllm_layer_type(built: Built, tmp_path: Path) -> None:
    def mistral(c: dict[str, Any]) -> None:
        c["transformer_layer_config"]["model_type"] = "mistral"

    report = check(variant(built, tmp_path, config=mistral), built)
    assert errors(report, "layer-type") == ["config.json:transformer_layer_config.model_type"]


def test_norm_before_residual_absent(built: Built, tmp_path: Path) -> None:
    report = check(variant(built, tmp_path, config=lambda c: c.pop("norm_before_residual")), built)
    assert errors(report, "norm-before-residual") == ["config.json:norm_before_residual"]


def test_aux_ids_absent(built: Built, tmp_path: Path) -> None:
    def drop(c: dict[str, Any]) -> None:
        del c["eagle_aux_hidden_state_layer_ids"]

    report = check(variant(built, tmp_path, config=drop), built)
    assert errors(report, "aux-ids-missing")


def _two_aux(c: dict[str, Any]) -> None:
    c["eagle_aux_hidden_state_layer_ids"] = [1, 3]


def _fc_for_two(sd: dict[str, torch.Tensor]) -> None:
    sd["fc.weight"] = sd["fc.weight"][:, : 2 * HIDDEN]


def test_aux_count_vllm_would_mis_size(built: Built, tmp_path: Path) -> None:
    # A draft trained on 2 aux layers, consistent in itself (fc is [H, 2H]), but without
    # num_aux_hidden_states vLLM sizes fc for 3.
    path = variant(built, tmp_path, config=_two_aux, tensors=_fc_for_two)
    report = check(path, built, expected_aux_ids=[1, 3])
    assert errors(report, "aux-count") == [
        "config.json:transformer_layer_config.num_aux_hidden_states"
    ]
    assert not errors(report, "tensor-shape")


def test_aux_count_declared_passes(built: Built, tmp_path: Path) -> None:
    def declare(c: dict[str, Any]) -> None:
        _two_aux(c)
        c["transformer_layer_config"]["num_aux_hidden_states"] = 2

    path = variant(built, tmp_path, config=declare, tensors=_fc_for_two)
    report = check(path, built, expected_aux_ids=[1, 3])
    assert report.ok, report.format()


def test_aux_count_contradicts_fc(built: Built, tmp_path: Path) -> None:
    def four(c: dict[str, Any]) -> None:
        c["transformer_layer_config"]["num_aux_hidden_states"] = 4

    assert errors(check(variant(built, tmp_path, config=four), built), "aux-count")


def test_aux_ids_differ_from_extraction(built: Built, tmp_path: Path) -> None:
    report = check(built.draft_dir, built, expected_aux_ids=[0, 1, 2])
    assert errors(report, "aux-ids-mismatch") == ["config.json:eagle_aux_hidden_state_layer_ids"]
    # the same rule through target.json's aux_layer_ids
    spec = dataclasses.replace(built.spec, aux_layer_ids=[1, 2, 0])
    report = validate_checkpoint(built.draft_dir, spec, reload=False)
    assert errors(report, "aux-ids-mismatch")


# --------------------------------------------------------------------------- target


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"hidden_size": 128}, "target-hidden"),
        ({"vocab_size": 512}, "target-vocab"),
        ({"vllm_architecture": "GPT2LMHeadModel"}, "target-arch"),
        ({"num_layers": 2}, "aux-ids-range"),
    ],
)
def test_draft_for_another_target(built: Built, change: dict[str, Any], code: str) -> None:
    spec = dataclasses.replace(built.spec, **change)
    report = validate_checkpoint(built.draft_dir, spec, reload=False)
    assert errors(report, code), report.format()


def test_real_target_needs_its_hub_id(built: Built) -> None:
    spec = dataclasses.replace(built.spec, hub_id="example-org/tiny-llama")
    report = validate_checkpoint(built.draft_dir, spec, reload=False)
    assert errors(report, "verifier-id") == ["config.json:speculators_config.verifier.name_or_path"]


def test_reload_failure_is_reported(built: Built, tmp_path: Path) -> None:
    # Point the reload at a target whose width differs: speculators itself refuses.
    other = tmp_path / "other_target"
    shutil.copytree(built.target_dir, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["hidden_size"] = 2 * HIDDEN
    (other / "config.json").write_text(json.dumps(cfg))
    report = validate_checkpoint(built.draft_dir, None, verifier_dir=other)
    assert errors(report, "reload") == [str(built.draft_dir)], report.format()


def test_without_target_warns_on_local_verifier_path(built: Built) -> None:
    report = validate_checkpoint(built.draft_dir, None, reload=False)
    assert report.ok
    assert "verifier-id" in report.codes("warning")
    assert "target-skipped" in report.codes("info")


# --------------------------------------------------------------------------- CLI


def test_cli_exit_codes(built: Built, tmp_path: Path) -> None:
    from eagle3_pipeline.tools.check_draft import main

    target_json = tmp_path / "target.json"
    atomic_write_json(target_json, built.spec.to_dict())
    bad = variant(built, tmp_path, tensors=lambda sd: sd.pop("norm.weight"))
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "eagle3_pipeline.tools.check_draft", "--no-reload"]

    # once through a real process: the exit status and a parseable --json report
    fail = subprocess.run(
        [*cmd, str(bad), "--target", str(target_json), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert fail.returncode == 1, fail.stdout + fail.stderr
    out = json.loads(fail.stdout)
    assert out["ok"] is False
    assert [e["where"] for e in out["errors"] if e["code"] == "tensor-missing"] == ["norm.weight"]

    assert main([str(built.draft_dir), "--target", str(target_json), "--no-reload"]) == 0
    assert main([str(built.draft_dir), "--target", str(tmp_path), "--no-reload"]) == 0
    assert main([str(bad), "--target", str(tmp_path / "nowhere"), "--no-reload"]) == 2
    assert main([str(built.draft_dir), "--target", str(built.target_dir), "--no-reload"]) == 0


# --------------------------------------------------------------------------- the stage


def test_validate_stage_stops_on_a_checkpoint_with_errors(built: Built, tmp_path: Path) -> None:
    """The validate stage measures nothing on a draft the validator fails: its error names
    the draft and the first errors, which is why its record carries no pass/fail flag."""
    from eagle3_pipeline.core.errors import StageError
    from eagle3_pipeline.validate.run import check_checkpoint

    spec = dataclasses.replace(built.spec, path=str(built.target_dir))
    assert check_checkpoint(built.draft_dir, spec).errors == 0
    bad = variant(built, tmp_path, tensors=lambda sd: sd.pop("norm.weight"))
    with pytest.raises(StageError, match=r"found \d+ error\(s\): .*norm\.weight") as exc:
        check_checkpoint(bad, spec)
    assert str(bad) in str(exc.value)
