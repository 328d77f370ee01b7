"""The `target` stage: the embedded tiny targets and the description of real ones."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from commands import stage
from safetensors.torch import load_file

from eagle3_pipeline.targets.adapter import load_target_spec
from eagle3_pipeline.targets.families.base import vllm_default_aux_layer_ids

REPO = Path(__file__).resolve().parents[2]


def _spec(workdir: Path):
    return load_target_spec(workdir / "data/target/target.json")


def test_tiny_kimi_is_a_nested_kimi_k25_under_the_real_weight_names(tiny_target):
    spec = _spec(tiny_target)
    assert spec.model_type == "kimi_k25" and spec.nested and spec.text_config_key == "text_config"
    assert spec.text_model_type == "deepseek_v3" and spec.attention == "mla" and spec.moe
    assert spec.architecture == "KimiK25ForConditionalGeneration"  # the real name
    assert spec.vllm_architecture == "KimiK25ForConditionalGeneration"
    assert spec.weights == {
        "embed_tokens": "language_model.model.embed_tokens.weight",
        "lm_head": "language_model.lm_head.weight",
        "final_norm": "language_model.model.norm.weight",
    }
    assert not spec.tie_word_embeddings and spec.chat_template
    assert spec.aux_layer_ids == vllm_default_aux_layer_ids(spec.num_layers) == [1, 2, 3]
    model_dir = tiny_target / spec.path
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    names = set(index["weight_map"])
    assert len(set(index["weight_map"].values())) > 1, "expected a sharded checkpoint"
    assert not any(n.startswith("language_model.model.blocks.") for n in names)
    assert "language_model.model.layers.3.mlp.experts.0.gate_proj.weight" in names
    assert "language_model.model.layers.0.mlp.gate_proj.weight" in names  # first layer dense
    assert any(n.startswith("vision_tower.") for n in names)
    # the index agrees with the shards
    on_disk = set()
    for shard in set(index["weight_map"].values()):
        on_disk |= set(load_file(model_dir / shard))
    assert on_disk == names
    metrics = json.loads((tiny_target / "metrics/details/target.json").read_text())
    assert metrics["reload_logits_identical"] is True


def test_tiny_kimi_reloads_with_transformers_and_identical_logits(tiny_target):
    import torch

    from eagle3_pipeline.targets.tiny import load_target_model

    spec = _spec(tiny_target)
    a = load_target_model(tiny_target / spec.path)
    b = load_target_model(tiny_target / spec.path)
    ids = torch.tensor([[1, 5, 9, 200, 301, 7]])
    with torch.no_grad():
        assert torch.equal(a(input_ids=ids).logits, b(input_ids=ids).logits)
    assert type(a).__name__ == "Kimi_K25ForConditionalGeneration"


def test_tiny_llama_is_flat(tiny_llama_target):
    spec = _spec(tiny_llama_target)
    assert not spec.nested and spec.architecture == "LlamaForCausalLM"
    assert spec.weights["embed_tokens"] == "model.embed_tokens.weight"
    assert spec.weights["lm_head"] == "lm_head.weight"
    assert spec.vllm_eagle3_supported


def test_chat_template_drops_past_reasoning(tiny_target):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_target / _spec(tiny_target).path)
    msgs = [
        {"role": "user", "content": "a?"},
        {"role": "assistant", "content": "A.", "reasoning_content": "think A"},
        {"role": "user", "content": "b?"},
        {"role": "assistant", "content": "B.", "reasoning_content": "think B"},
    ]
    text = tok.apply_chat_template(msgs, tokenize=False)
    assert "think A" not in text and "<think></think>A.<|im_end|>" in text
    assert "<think>think B</think>B.<|im_end|>" in text
    prompt = tok.apply_chat_template(msgs[:3], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_assistant|>assistant<|im_middle|>")
    # the end-of-turn token is one id, and so are the reasoning markers
    for t in ("<|im_end|>", "<think>", "</think>"):
        assert len(tok(t, add_special_tokens=False)["input_ids"]) == 1


@pytest.mark.integration  # builds and trains the tiny target twice
def test_tiny_target_build_is_deterministic(tmp_path):
    """Same seed -> the same tokenizer and the same weights, bit for bit."""
    from eagle3_pipeline.core.config import load_config
    from eagle3_pipeline.targets.tiny import build_tiny_target

    cfg = load_config(["target.train_steps=3"], conf_dir=REPO / "conf")
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        build_tiny_target(cfg.model.tiny, cfg.target, d, cfg.seed, progress=False)
    assert (dirs[0] / "tokenizer.json").read_bytes() == (dirs[1] / "tokenizer.json").read_bytes()
    shards = sorted(p.name for p in dirs[0].glob("*.safetensors"))
    assert shards == sorted(p.name for p in dirs[1].glob("*.safetensors"))
    for s in shards:
        a, b = load_file(dirs[0] / s), load_file(dirs[1] / s)
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].view(-1).view_as(a[k]).equal(b[k]), k


@pytest.mark.slow
def test_trained_tiny_target_beats_unigram_by_half(tmp_path):
    """The default target training makes it language-like: perplexity <= 0.5x unigram."""
    from eagle3_pipeline.core.config import load_config
    from eagle3_pipeline.targets.tiny import build_tiny_target

    cfg = load_config(["target.train_steps=120"], conf_dir=REPO / "conf")
    m = build_tiny_target(cfg.model.tiny, cfg.target, tmp_path / "t", cfg.seed, progress=False)
    assert m.heldout_perplexity <= 0.5 * m.unigram_perplexity, m
    assert m.heldout_perplexity < m.heldout_perplexity_untrained


# ------------------------------------------------------------------ real targets, bad input


def _run_target(cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    return stage(cwd, "target", "--conf-dir", REPO / "conf", *overrides, timeout=300)


@pytest.fixture
def local_llama_dir(tiny_llama_target, tmp_path) -> Path:
    """A 'real' target checkout: the tiny llama's directory, copied."""
    src = tiny_llama_target / _spec(tiny_llama_target).path
    dst = tmp_path / "checkout"
    shutil.copytree(src, dst)
    return dst


REAL = ("model=tiny_llama", "model.tiny=null", "model.name=local")


def test_real_local_target_is_described_without_building(local_llama_dir, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    proc = _run_target(work, *REAL, f"model.path={local_llama_dir}")
    assert proc.returncode == 0, proc.stderr
    spec = _spec(work)
    assert spec.path == str(local_llama_dir) and spec.num_layers == 4
    assert not (work / "data/target/model").exists()  # never copies weights
    assert json.loads((work / "metrics/details/target.json").read_text())["built"] is False


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("missing_dir", "does not exist"),
        ("no_config", "config.json"),
        ("no_template", "chat template"),
        ("aux_out_of_range", "out of range"),
        ("hub_without_revision", "model.revision"),
    ],
)
def test_bad_target_input_is_refused_with_one_line(local_llama_dir, tmp_path, case, needle):
    work = tmp_path / "work"
    work.mkdir()
    args = [*REAL, f"model.path={local_llama_dir}"]
    if case == "missing_dir":
        args[-1] = f"model.path={tmp_path / 'nope'}"
    elif case == "no_config":
        (local_llama_dir / "config.json").unlink()
    elif case == "no_template":
        (local_llama_dir / "chat_template.jinja").unlink(missing_ok=True)
        cfg_path = local_llama_dir / "tokenizer_config.json"
        tok_cfg = json.loads(cfg_path.read_text())
        tok_cfg.pop("chat_template", None)
        cfg_path.write_text(json.dumps(tok_cfg))
    elif case == "aux_out_of_range":
        args.append("model.aux_layer_ids=[1,2,9]")
    elif case == "hub_without_revision":
        args = [*REAL, "model.hub_id=org/some-model"]
    proc = _run_target(work, *args)
    assert proc.returncode != 0
    err_lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(err_lines) == 1 and needle in err_lines[0], proc.stderr
    assert not (work / "data/target/target.json").exists()
