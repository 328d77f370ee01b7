"""Warm starts (``train.init_from``) from every EAGLE-3 draft layout, on real files.

Quick tier: a tiny Llama target is written by hand (``save_pretrained`` of an untrained
8-layer, 32-wide model), drafts are written by speculators' own ``save_pretrained`` (or in
the original EAGLE-3 layout by hand), and the warm start runs the train loop's sequence
(``describe`` -> layout check -> conversion -> reload -> vocabulary -> ``build_draft`` ->
``copy_weights``). Nothing is trained.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from target_samples import LLAMA, target_spec

from eagle3_pipeline.core.config import DraftShapeConfig
from eagle3_pipeline.core.errors import ConfigError
from eagle3_pipeline.draft.shape import DraftShape
from eagle3_pipeline.targets.adapter import MlaDims, TargetSpec

VOCAB, HIDDEN, LAYERS = 96, 32, 8
AUX = [2, 4, 5]  # the default taps (2, L//2, L-3) of an 8-layer target
# every option off: the original EAGLE-3 layer has none of them
OPTIONS = DraftShapeConfig(
    norm_before_residual=False, norm_before_fc=False, fc_norm=False, norm_output=False
)
# each warm start builds and saves real drafts
pytestmark = pytest.mark.integration

SHAPE = DraftShape(
    layer_type="llama",
    num_layers=1,
    hidden_size=HIDDEN,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    intermediate_size=64,
    rms_norm_eps=1e-6,
    max_position_embeddings=256,
)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain ``LlamaForCausalLM`` directory: the target (and the non-draft source)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    out = tmp_path_factory.mktemp("target")
    LlamaForCausalLM(config).save_pretrained(out)
    return out


def spec_of(target: Path, **changes: Any) -> TargetSpec:
    """The tiny llama target at ``target`` as the target stage records it."""
    return target_spec(
        **{
            **LLAMA,
            "name": "tiny",
            "num_layers": LAYERS,
            "hidden_size": HIDDEN,
            "vocab_size": VOCAB,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "intermediate_size": 64,
            "aux_layer_ids": list(AUX),
            "path": str(target),
            **changes,
        }
    )


def vocab_maps(draft_vocab: int) -> tuple[Any, Any]:
    """A draft vocabulary of the ``draft_vocab`` highest ids (offsets: not the identity)."""
    if draft_vocab == VOCAB:
        return None, None
    start = VOCAB - draft_vocab
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[start:] = True
    return torch.full((draft_vocab,), start, dtype=torch.long), t2d


def build(target: Path, draft_vocab: int, d2t: Any = None, t2d: Any = None) -> Any:
    """What the train loop builds: a fresh draft with the target's frozen tensors."""
    from eagle3_pipeline.draft.shape import build_draft

    if d2t is None and draft_vocab != VOCAB:
        d2t, t2d = vocab_maps(draft_vocab)
    return build_draft(
        spec_of(target), SHAPE, 3, draft_vocab, d2t, t2d, target, "sdpa", False, OPTIONS
    )


def write_draft(target: Path, out: Path, draft_vocab: int, head: Any = None) -> Any:
    """A speculators EAGLE-3 draft as speculators' ``save_pretrained`` writes it; ``head``:
    a trained head of the source's own (else the target's rows)."""
    torch.manual_seed(1)
    model = build(target, draft_vocab)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.normal_()
        if head is not None:
            model.lm_head.weight.copy_(head)
    model.save_pretrained(out)
    return model


def edit_config(path: Path, **changes: Any) -> None:
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        node = config
        *parents, last = key.split("__")
        for part in parents:
            node = node[part]
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
    (path / "config.json").write_text(json.dumps(config))


DELETE = object()


def warm_start(target: Path, source_dir: Path, work: Path, draft_vocab: int) -> Any:
    """The train stage's warm start (plan_training, then DraftTrainer._build_model)."""
    from eagle3_pipeline.train import warm_start as ws

    spec = spec_of(target)
    source = ws.describe(source_dir)
    ws.check_compatible(
        source,
        ws.source_layout(source, spec.num_layers),
        ws.run_layout(SHAPE, spec, draft_vocab, OPTIONS),
    )
    init_dir = ws.speculators_dir(source, target, work, spec)
    loaded = ws.load_source(init_dir, target)
    d2t, t2d = ws.vocab(loaded)
    model = build(target, draft_vocab, d2t, t2d) if d2t is not None else build(target, VOCAB)
    ws.copy_weights(model, loaded, ws.weight_shapes(init_dir))
    return model


def target_rows(target: Path, name: str) -> Any:
    from safetensors.torch import load_file

    return load_file(str(target / "model.safetensors"))[name]


def tensors(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def refusal(fn: Any, *args: Any) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args)
    message = str(info.value)
    assert "\n" not in message, message
    return message


# --------------------------------------------------------------------------- vocabulary


def test_a_full_vocabulary_speculators_draft_warm_starts_exactly(
    target: Path, tmp_path: Path
) -> None:
    """speculators writes no d2t/t2d when the draft vocabulary is the target's; such a
    source is accepted and every tensor of the new draft is the source's."""
    source = tmp_path / "full"
    write_draft(target, source, VOCAB)
    assert not {"d2t", "t2d"} & set(tensors(source))
    model = warm_start(target, source, tmp_path / "work", VOCAB)
    assert model.d2t is None and model.t2d is None
    want = tensors(source)
    for name, tensor in want.items():
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=0, atol=0, msg=name)


def test_a_full_vocabulary_original_eagle3_draft_keeps_its_trained_head(
    target: Path, tmp_path: Path
) -> None:
    """An original EAGLE-3 draft (midlayer.*, no d2t/t2d: full vocabulary) whose head was
    trained: converted, and the new draft carries its head, not the target's rows."""
    torch.manual_seed(2)
    head = torch.randn(VOCAB, HIDDEN)
    made = tmp_path / "made"
    write_draft(target, made, VOCAB, head=head)
    original = write_original(made, tmp_path / "original", VOCAB)
    model = warm_start(target, original, tmp_path / "work", VOCAB)
    torch.testing.assert_close(model.lm_head.weight, head, rtol=0, atol=0)
    for name, tensor in tensors(made).items():
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=0, atol=0, msg=name)
    # the training targets stay the target's own head
    torch.testing.assert_close(
        model.verifier_lm_head.weight, target_rows(target, "lm_head.weight"), rtol=0, atol=0
    )


def write_original(made: Path, out: Path, draft_vocab: int) -> Path:
    """``made``'s weights in the original EAGLE-3 layout (SafeAILab's names and config)."""
    from safetensors.torch import save_file

    ours = json.loads((made / "config.json").read_text())
    layer = ours["transformer_layer_config"]
    out.mkdir()
    weights = {k.replace("layers.0.", "midlayer."): v for k, v in tensors(made).items()}
    weights.pop("embed_tokens.weight")  # SafeAILab's trainer does not save it
    save_file(weights, str(out / "model.safetensors"))
    keys = ["hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"]
    keys += ["head_dim", "rms_norm_eps", "max_position_embeddings", "vocab_size"]
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        **{k: layer[k] for k in keys},
        "num_hidden_layers": 1,
        "draft_vocab_size": draft_vocab,
        "torch_dtype": "float32",
    }
    (out / "config.json").write_text(json.dumps(config))
    return out


# --------------------------------------------------------------------------- frozen tensors


def test_a_foreign_trained_head_is_the_warm_started_drafts_head(
    target: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A speculators draft (reduced vocabulary) whose lm_head is not the target's rows: the
    new draft starts from the source's head, says so in one line, and its mapping is the
    source's; the loss still reads the target's rows."""
    torch.manual_seed(3)
    head = torch.randn(48, HIDDEN)
    source = tmp_path / "foreign"
    write_draft(target, source, 48, head=head)
    with caplog.at_level(logging.INFO, logger="eagle3_pipeline.train.warm_start"):
        model = warm_start(target, source, tmp_path / "work", 48)
    torch.testing.assert_close(model.lm_head.weight, head, rtol=0, atol=0)
    rows = target_rows(target, "lm_head.weight")[VOCAB - 48 :]
    torch.testing.assert_close(model.verifier_lm_head.weight, rows, rtol=0, atol=0)
    torch.testing.assert_close(model.d2t, tensors(source)["d2t"], rtol=0, atol=0)
    said = [r.getMessage() for r in caplog.records if "lm_head.weight" in r.getMessage()]
    assert len(said) == 1 and "source's, not the target's rows" in said[0], said


# --------------------------------------------------------------------------- refusals


def test_a_plain_model_directory_is_refused_in_one_line(target: Path) -> None:
    """The target itself (a LlamaForCausalLM directory) is no draft: refused before any
    conversion, naming its config file and key."""
    from eagle3_pipeline.train.warm_start import describe

    message = refusal(describe, target)
    assert f"{target / 'config.json'}'s architectures" in message
    assert "not an EAGLE-3 draft" in message


@pytest.mark.parametrize(
    ("fmt", "key", "change", "said"),
    [
        ("speculators", "transformer_layer_config.hidden_size", DELETE, "is missing"),
        ("speculators", "transformer_layer_config", DELETE, "is missing"),
        ("speculators", "draft_vocab_size", DELETE, "is missing"),
        (
            "speculators",
            "transformer_layer_config.intermediate_size",
            "64",
            'is "64", not an integer',
        ),
        ("speculators", "norm_before_residual", "false", 'is "false", not true or false'),
        ("mla", "kv_lora_rank", DELETE, "is missing"),
        ("eagle3", "num_key_value_heads", DELETE, "is missing"),
        ("eagle3", "draft_vocab_size", DELETE, "is missing"),
        (
            "eagle3",
            "eagle_aux_hidden_state_layer_ids",
            [1, 2, 4, 5],
            "is [1, 2, 4, 5]: speculators'",
        ),
    ],
)
def test_a_malformed_config_is_refused_in_one_line_naming_file_and_key(
    target: Path, tmp_path: Path, fmt: str, key: str, change: Any, said: str
) -> None:
    from eagle3_pipeline.train.warm_start import describe

    source = tmp_path / "made"
    write_draft(target, source, 48)
    if fmt == "eagle3":
        source = write_original(source, tmp_path / "original", 48)
    elif fmt == "mla":
        source = tmp_path / "mla"
        source.mkdir()
        (source / "config.json").write_text(json.dumps(mla_config()))
    edit_config(source, **{key.replace(".", "__"): change})
    message = refusal(describe, source)
    assert f"{source / 'config.json'}: {key} {said}" in message, message


def mla_config(**changes: Any) -> dict[str, Any]:
    """An MLA draft's config as this pipeline writes it (draft/mla_format.py)."""
    config = {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "hidden_size": HIDDEN,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 16,
        "kv_lora_rank": 8,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
        "vocab_size": VOCAB,
        "draft_vocab_size": 48,
        "target_hidden_size": HIDDEN,
        "norm_before_residual": False,
        "fc_norm": False,
        "norm_output": False,
        "eagle_aux_hidden_state_layer_ids": AUX,
    }
    return {**config, **changes}


# --------------------------------------------------------------------------- each compared field


def _check(target: Path, source_dir: Path, shape: DraftShape = SHAPE, **spec: Any) -> str:
    from eagle3_pipeline.train import warm_start as ws

    s = spec_of(target, **spec)
    source = ws.describe(source_dir)
    run = ws.run_layout(shape, s, 48, OPTIONS)
    return refusal(ws.check_compatible, source, ws.source_layout(source, s.num_layers), run)


@pytest.mark.parametrize(
    ("key", "value", "field", "fix"),
    [
        ("transformer_layer_config__hidden_size", 48, "hidden_size", "another target"),
        ("target_hidden_size", 64, "target_hidden_size", "another target"),
        ("eagle_aux_hidden_state_layer_ids", [1, 3, 6], "aux_layer_ids", "model.aux_layer_ids"),
        ("norm_before_residual", True, "norm_before_residual", "train.draft.norm_before_residual"),
        ("norm_output", True, "norm_output", "train.draft.norm_output"),
        ("fc_norm", True, "fc_norm", "train.draft.fc_norm"),
    ],
)
def test_each_differing_field_is_refused_naming_the_sources_file_and_key(
    target: Path, tmp_path: Path, key: str, value: Any, field: str, fix: str
) -> None:
    source = tmp_path / "draft"
    write_draft(target, source, 48)
    edit_config(source, **{key: value})
    message = _check(target, source)
    named = key.replace("__", ".")
    assert f"its {field} is {json.dumps(value)} ({source / 'config.json'}: {named})" in message
    assert fix in message and "train.init_from=null" in message, message


def test_a_source_naming_no_aux_layers_reads_as_the_targets_default_taps(
    target: Path, tmp_path: Path
) -> None:
    """speculators and vLLM tap (2, L//2, L-3) for a draft that names no aux layers: such a
    source fits a run on those layers, and is refused (naming them) for a run on others."""
    from eagle3_pipeline.train import warm_start as ws

    source = tmp_path / "draft"
    write_draft(target, source, 48)
    edit_config(source, eagle_aux_hidden_state_layer_ids=None)
    with pytest.warns(UserWarning, match=r"Setting target layers to \[2, 4, 5\]"):  # speculators'
        model = warm_start(target, source, tmp_path / "work", 48)
    assert list(model.config.eagle_aux_hidden_state_layer_ids) == AUX
    message = _check(target, source, aux_layer_ids=[1, 3, 6])
    assert "its aux_layer_ids is [2, 4, 5]" in message and "model.aux_layer_ids" in message
    assert ws.default_aux_layers(LAYERS) == AUX


def test_mla_latent_sizes_are_compared_one_by_one(target: Path, tmp_path: Path) -> None:
    """An MLA source whose kv_lora_rank differs from the run's (the target's) is refused
    naming that key, not the whole latent block."""
    source = tmp_path / "mla"
    source.mkdir()
    (source / "config.json").write_text(json.dumps(mla_config(kv_lora_rank=16)))
    dims = MlaDims(
        q_lora_rank=16, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8
    )
    shape = replace(SHAPE, layer_type="mla", num_key_value_heads=4, head_dim=12, mla=dims)
    message = _check(target, source, shape, attention="mla", mla=dims)
    assert "its mla is " in message
    assert f"({source / 'config.json'}: kv_lora_rank)" in message
    assert "another target" in message
