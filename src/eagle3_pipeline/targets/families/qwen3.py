"""Qwen3 (dense): a flat decoder with per-head q/k RMSNorm and a ``<think>`` block."""

from __future__ import annotations

from eagle3_pipeline.targets.families.base import Family

FAMILY = Family(
    name="qwen3",
    model_types=("qwen3",),
    architectures=("Qwen3ForCausalLM",),
    vllm_architecture="Qwen3ForCausalLM",
    vllm_eagle3=True,
    qk_norm=True,
    end_of_turn="<|im_end|>",
    reasoning_markers=("<think>", "</think>"),
)
