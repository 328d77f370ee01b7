"""The MLA draft layer (``train.draft.layer_type=mla``): its forward against a plain
reference implementation of multi-head latent attention with adjacent-pair (GPT-J) rope,
as vLLM's ``deepseek_eagle3`` computes it; speculators builds and trains it; it is saved
in the plain DeepSeek config vLLM serves, passes the checkpoint validator, and reloads
to the same weights."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from eagle3_pipeline.core.choices import DraftLayerType
from eagle3_pipeline.core.config import ConfigError, DraftShapeConfig

pytestmark = pytest.mark.integration

H, HEADS, Q_LORA, KV_LORA, ROPE, NOPE, V, WIDTH = 32, 2, 16, 24, 8, 12, 10, 48


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope_pairs(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate adjacent pairs (x[2i], x[2i+1]) by pos * theta^(-2i/d): vLLM's
    ``is_neox_style=False`` for DeepSeek MLA."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = (pos[:, None].double() * inv[None, :]).to(x.dtype)  # [n, d/2]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def _reference(layer: Any, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """EAGLE-3's first layer with MLA, written out: norms, [embeds, hidden] into the q and
    latent projections, causal softmax attention over nope + rope parts, residual, MLP."""
    a, sd = layer.self_attn, {k: v.detach() for k, v in layer.state_dict().items()}
    n = embeds.shape[0]
    pos = torch.arange(n)
    h_normed = _rms(hidden, sd["hidden_norm.weight"])
    x = torch.cat([_rms(embeds, sd["input_layernorm.weight"]), h_normed], -1)
    residual = h_normed  # norm_before_residual
    q = x @ sd["self_attn.q_a_proj.weight"].T
    q = _rms(q, sd["self_attn.q_a_layernorm.weight"]) @ sd["self_attn.q_b_proj.weight"].T
    q = q.view(n, HEADS, NOPE + ROPE)
    q_nope, q_pe = (
        q[..., :NOPE],
        _rope_pairs(q[..., NOPE:], pos, a.config.rope_parameters["rope_theta"]),
    )
    ckv = x @ sd["self_attn.kv_a_proj_with_mqa.weight"].T
    latent, k_pe = ckv[:, :KV_LORA], ckv[:, KV_LORA:].view(n, 1, ROPE)
    k_pe = _rope_pairs(k_pe, pos, a.config.rope_parameters["rope_theta"])
    kv = _rms(latent, sd["self_attn.kv_a_layernorm.weight"]) @ sd["self_attn.kv_b_proj.weight"].T
    kv = kv.view(n, HEADS, NOPE + V)
    k_nope, v = kv[..., :NOPE], kv[..., NOPE:]
    scores = torch.einsum("qhd,khd->hqk", q_nope, k_nope) + torch.einsum(
        "qhd,kd->hqk", q_pe, k_pe[:, 0]
    )
    scores = scores / math.sqrt(NOPE + ROPE)
    scores = scores.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), -math.inf)
    out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, HEADS * V)
    h = residual + out @ sd["self_attn.o_proj.weight"].T
    y = _rms(h, sd["post_attention_layernorm.weight"])
    gate, up = y @ sd["mlp.gate_proj.weight"].T, y @ sd["mlp.up_proj.weight"].T
    return h + (torch.nn.functional.silu(gate) * up) @ sd["mlp.down_proj.weight"].T


def _layer_config(q_lora: int | None = Q_LORA) -> Any:
    from eagle3_pipeline.draft import mla

    cfg = mla.layer_config(
        vocab_size=64,
        hidden_size=H,
        intermediate_size=WIDTH,
        num_layers=1,
        num_attention_heads=HEADS,
        q_lora_rank=q_lora,
        kv_lora_rank=KV_LORA,
        qk_nope_head_dim=NOPE,
        qk_rope_head_dim=ROPE,
        v_head_dim=V,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
        rope={"rope_theta": 1000.0},
    )
    cfg._attn_implementation = "sdpa"
    return cfg


def test_first_layer_matches_a_plain_mla_reference() -> None:
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

    from eagle3_pipeline.draft import mla

    torch.manual_seed(0)
    cfg = _layer_config()
    layer = mla.first_layer_class()(cfg, layer_idx=0, norm_before_residual=True).eval()
    for p in layer.parameters():  # norms away from 1 so a swapped norm would show
        torch.nn.init.normal_(p, std=0.3 if p.dim() == 1 else 0.15)
    for name, p in layer.named_parameters():
        if name.endswith("norm.weight"):
            p.data.add_(1.0)
    n = 11
    embeds, hidden = torch.randn(n, H), torch.randn(n, H)
    # the projections that read the input take [embeddings, hidden]: 2 x hidden wide
    assert layer.self_attn.q_a_proj.in_features == 2 * H
    assert layer.self_attn.kv_a_proj_with_mqa.in_features == 2 * H
    pos = torch.arange(n)[None]
    rope = DeepseekV3RotaryEmbedding(cfg)(embeds[None], pos)
    causal = torch.tril(torch.ones(n, n, dtype=torch.bool))[None, None]
    with torch.no_grad():
        got = layer(
            torch.cat([embeds, hidden], -1)[None],
            attention_mask=causal,
            position_ids=pos,
            position_embeddings=rope,
        )[0]
        want = _reference(layer, embeds, hidden)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_one_q_projection_without_low_rank() -> None:
    from eagle3_pipeline.draft import mla

    layer = mla.first_layer_class()(_layer_config(q_lora=None), layer_idx=0)
    assert layer.self_attn.q_proj.weight.shape == (HEADS * (NOPE + ROPE), 2 * H)
    assert layer.self_attn.q_a_proj is None


def test_speculators_builds_the_registered_layer() -> None:
    """compat.speculators.register_draft_layer reaches the dict Eagle3DraftModel reads: if
    speculators moves it, this fails."""
    from speculators.models.eagle3 import core

    from eagle3_pipeline.draft import mla

    mla.register()
    assert core.model_classes[mla.LAYER_MODEL_TYPE].first_layer_class is mla.first_layer_class()


def test_mla_needs_an_mla_target_and_takes_its_latent_sizes(tiny_target: Path) -> None:
    from eagle3_pipeline.draft.shape import resolve_draft_shape
    from eagle3_pipeline.targets.adapter import load_target_spec

    spec = load_target_spec(tiny_target / "data/target/target.json")
    shape = resolve_draft_shape(DraftShapeConfig(layer_type=DraftLayerType.mla), spec)
    assert shape.mla == spec.mla and shape.mla is not None
    assert shape.mla.kv_lora_rank + shape.mla.qk_rope_head_dim == 576  # vLLM's CPU kernel
    with pytest.raises(ConfigError, match="train.draft.head_dim=8: an MLA draft layer"):
        resolve_draft_shape(DraftShapeConfig(layer_type=DraftLayerType.mla, head_dim=8), spec)
    llama = dataclasses.replace(spec, attention="standard", mla=None)
    with pytest.raises(ConfigError, match="has no MLA attention"):
        resolve_draft_shape(DraftShapeConfig(layer_type=DraftLayerType.mla), llama)


def test_saved_as_vllm_serves_it_validated_and_reloaded(tiny_target: Path, tmp_path: Path) -> None:
    """Build (speculators' Eagle3DraftModel with the MLA layer), one training step, save:
    the plain config vLLM reads, no validator error, and the reload has the same weights."""
    from speculators.losses import resolve_loss_config

    from eagle3_pipeline.draft.checkpoint import load_trained_draft
    from eagle3_pipeline.draft.shape import build_draft, estimate_parameters, resolve_draft_shape
    from eagle3_pipeline.targets.adapter import load_target_spec
    from eagle3_pipeline.train.save import save_draft
    from eagle3_pipeline.validate.checkpoint import validate_checkpoint

    spec = load_target_spec(tiny_target / "data/target/target.json")
    model_dir = tiny_target / "data/target" / Path(spec.path or "").name
    spec = dataclasses.replace(spec, path=str(model_dir))
    options = DraftShapeConfig(layer_type=DraftLayerType.mla)
    shape = resolve_draft_shape(options, spec)
    dv = 512
    d2t = torch.arange(dv) * 2 - torch.arange(dv)  # offset style: draft i -> target 2i
    t2d = torch.zeros(spec.vocab_size, dtype=torch.bool)
    t2d[torch.arange(dv) * 2] = True
    torch.manual_seed(0)
    model = build_draft(spec, shape, 3, dv, d2t, t2d, model_dir, "sdpa_packed", options=options)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    assert (trainable, frozen) == estimate_parameters(shape, 3, dv, spec.vocab_size, options)
    assert model.input_norm is None  # norm_before_fc null: off for mla
    n = 160
    doc = torch.cat([torch.zeros(1, 90), torch.ones(1, 70)], 1).long()
    _, loss, _ = model(
        torch.randn(1, n, 3 * spec.hidden_size),
        torch.randint(0, spec.vocab_size, (1, n)),
        doc,
        loss_mask=torch.ones(1, n, dtype=torch.bool),
        verifier_last_hidden_states=torch.randn(1, n, spec.hidden_size),
        ttt_steps=3,
        loss_config=resolve_loss_config("kl_div", "eager"),
    )
    loss.backward()
    assert (
        model.fc.weight.grad is not None
        and model.layers[0].self_attn.kv_b_proj.weight.grad.abs().sum() > 0
    )

    out = tmp_path / "data" / "draft"
    save_draft(model, out, 3)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DeepseekV2ForCausalLM"]
    assert config["model_type"] == "deepseek_v2" and "speculators_config" not in config
    assert config["eagle_aux_hidden_state_layer_ids"] == spec.aux_layer_ids
    assert (config["kv_lora_rank"], config["qk_rope_head_dim"]) == (512, 64)
    assert config["rope_scaling"]["type"] == "yarn"  # the target's rope, as it spells it
    assert not (out / "config.py").exists()

    report = validate_checkpoint(out, spec, verifier_dir=model_dir)
    assert not report.errors, [str(f) for f in report.errors]
    reloaded = load_trained_draft(out, model_dir)
    saved = {k: v for k, v in model.state_dict().items() if not k.startswith("verifier_")}
    for name, tensor in reloaded.state_dict().items():
        if name in saved:
            torch.testing.assert_close(tensor, saved[name], rtol=0, atol=0, msg=name)
    assert (
        reloaded.config.speculators_config.verifier.name_or_path
        == config["eagle3_pipeline"]["verifier"]["name_or_path"]
    )

    # the validator knows vLLM's traps for this format
    bad = dict(config, model_type="deepseek_v3", norm_before_fc=True)
    bad.pop("eagle_aux_hidden_state_layer_ids")
    (out / "config.json").write_text(json.dumps(bad))
    codes = {f.code for f in validate_checkpoint(out, spec, reload=False).errors}
    assert {"model-type", "mla-option", "aux-ids-missing"} <= codes


def test_a_target_without_a_query_low_rank_gets_a_draft_vllm_loads(
    tiny_target: Path, tmp_path: Path
) -> None:
    """``q_lora_rank: null`` on the target: the draft still has a query low rank
    (min(kv_lora_rank, hidden)), because vLLM's deepseek_eagle3 loads kv_a_proj_with_mqa
    only into the fused projection a q_lora_rank builds; saved, it passes the validator
    (which refuses the one-q_proj form: tests/validate/test_checkpoint.py)."""
    from eagle3_pipeline.draft.shape import build_draft, estimate_parameters, resolve_draft_shape
    from eagle3_pipeline.targets.adapter import load_target_spec
    from eagle3_pipeline.train.save import save_draft
    from eagle3_pipeline.validate.checkpoint import validate_checkpoint

    spec = load_target_spec(tiny_target / "data/target/target.json")
    model_dir = tiny_target / "data/target" / Path(spec.path or "").name
    assert spec.mla is not None
    target_mla = dataclasses.replace(spec.mla, q_lora_rank=None)
    spec = dataclasses.replace(spec, path=str(model_dir), mla=target_mla)
    options = DraftShapeConfig(layer_type=DraftLayerType.mla)
    shape = resolve_draft_shape(options, spec)
    assert shape.mla == dataclasses.replace(target_mla, q_lora_rank=spec.hidden_size)  # < 512
    dv = 512
    d2t = torch.arange(dv) * 2 - torch.arange(dv)
    t2d = torch.zeros(spec.vocab_size, dtype=torch.bool)
    t2d[torch.arange(dv) * 2] = True
    model = build_draft(spec, shape, 3, dv, d2t, t2d, model_dir, "sdpa", options=options)
    attn = model.layers[0].self_attn
    assert attn.q_a_proj.weight.shape == (spec.hidden_size, 2 * spec.hidden_size)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == estimate_parameters(shape, 3, dv, spec.vocab_size, options)[0]
    out = tmp_path / "draft"
    config = save_draft(model, out, 3)
    assert config["q_lora_rank"] == spec.hidden_size
    report = validate_checkpoint(out, spec, verifier_dir=model_dir)
    assert not report.errors, [str(f) for f in report.errors]
