"""Drafts vLLM's EAGLE-3 loaders refuse, each made from a good one by one defect.

One list of rules for both tiers: the quick tests show the checkpoint validator refusing
each defect, the slow test shows real vLLM refusing the same bytes, so the validator's
model of vLLM's loaders (``llama_eagle3.py``, ``deepseek_eagle3.py``, vLLM 0.32) cannot
drift from vLLM unnoticed. A defect edits a draft directory in place: its config.json
(a dict) and its single ``model.safetensors`` (a state dict).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

Config = dict[str, Any]
Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class LoaderRule:
    """A defect, the layout it applies to, and what each side says about it."""

    id: str
    layout: str  # "llama" (speculators config) or "mla" (plain DeepSeek config)
    defect: Callable[[Config, Tensors], None]
    code: str  # the validator's finding code
    where: str  # ... and where it points (a substring)
    vllm_says: str  # a substring of vLLM's refusal


def _vocab(config: Config) -> int:
    layer = config.get("transformer_layer_config") or config
    return int(layer["vocab_size"])


def _full_vocab_d2t(config: Config, sd: Tensors) -> None:
    """A draft over the whole target vocabulary that still carries d2t / t2d."""
    vocab = _vocab(config)
    config["draft_vocab_size"] = vocab
    head = sd["lm_head.weight"]
    torch.manual_seed(0)
    sd["lm_head.weight"] = (torch.randn(vocab, head.shape[1]) * 0.02).to(head.dtype)
    sd["d2t"] = torch.zeros(vocab, dtype=torch.int64)
    sd["t2d"] = torch.ones(vocab, dtype=torch.bool)


def _input_norm(config: Config, sd: Tensors) -> None:
    sd["input_norm.weight"] = torch.ones(sd["fc.weight"].shape[1], dtype=sd["fc.weight"].dtype)


def _mask_hidden(config: Config, sd: Tensors) -> None:
    sd["mask_hidden"] = torch.zeros(1, sd["fc.weight"].shape[1], dtype=sd["fc.weight"].dtype)


def _full_q_proj(config: Config, sd: Tensors) -> None:
    """The MLA layer with one full query projection (``q_lora_rank: null``), as this
    pipeline wrote it for a target without a query low rank before vLLM was shown to
    refuse it."""
    p = "layers.0.self_attn."
    width = sd[f"{p}q_a_proj.weight"].shape[1]
    dtype = sd[f"{p}q_a_proj.weight"].dtype
    for name in ("q_a_proj", "q_a_layernorm", "q_b_proj"):
        del sd[f"{p}{name}.weight"]
    heads = int(config["num_attention_heads"])
    qk = int(config["qk_nope_head_dim"]) + int(config["qk_rope_head_dim"])
    torch.manual_seed(0)
    sd[f"{p}q_proj.weight"] = (torch.randn(heads * qk, width) * 0.02).to(dtype)
    config["q_lora_rank"] = None


RULES = [
    LoaderRule(
        "mla-q-proj",
        "mla",
        _full_q_proj,
        "mla-q-lora",
        "config.json:q_lora_rank",
        "There is no module or parameter named 'layers.0.self_attn.fused_qkv_a_proj' in "
        "DeepseekV2Eagle3Model",
    ),
    LoaderRule(
        "mla-input-norm",
        "mla",
        _input_norm,
        "tensor-unknown",
        "input_norm.weight",
        "There is no module or parameter named 'input_norm' in DeepseekV2Eagle3Model",
    ),
    LoaderRule(
        "mla-mask-hidden",
        "mla",
        _mask_hidden,
        "tensor-unknown",
        "mask_hidden",
        "There is no module or parameter named 'mask_hidden' in DeepseekV2Eagle3Model",
    ),
    LoaderRule(
        "mla-full-vocab-d2t",
        "mla",
        _full_vocab_d2t,
        "tensor-unknown",
        "d2t",
        "There is no module or parameter named 'draft_id_to_target_id' in "
        "Eagle3DeepseekV2ForCausalLM",
    ),
    LoaderRule(
        "llama-full-vocab-d2t",
        "llama",
        _full_vocab_d2t,
        "tensor-unknown",
        "d2t",
        "There is no module or parameter named 'draft_id_to_target_id' in Eagle3LlamaForCausalLM",
    ),
]


def apply(rule_or_defect: LoaderRule | Callable[[Config, Tensors], None], draft: Path) -> None:
    """Apply a defect to the draft directory ``draft`` in place."""
    defect = rule_or_defect.defect if isinstance(rule_or_defect, LoaderRule) else rule_or_defect
    config = json.loads((draft / "config.json").read_text())
    sd = load_file(draft / "model.safetensors")
    defect(config, sd)
    save_file(
        {k: v.contiguous() for k, v in sd.items()},
        draft / "model.safetensors",
        metadata={"format": "pt"},
    )
    (draft / "config.json").write_text(json.dumps(config, indent=2))
