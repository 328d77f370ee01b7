"""``metrics/details/validate.json``: every figure of one validation.

Built by :func:`eagle3_pipeline.validate.run.validate_draft`; its headline fields go to
dvclive's summary (:func:`eagle3_pipeline.validate.live.write_live`) and from there to
``dvc exp show`` and ``eagle3-compare``. The vLLM figures are set with ``validate.vllm``
only, the best K with ``validate.k_sweep`` too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eagle3_pipeline.core.records import Record, headline, optional


@dataclass(kw_only=True)
class ValidateRecord(Record):
    STAGE = "validate"
    HEADLINE_IN_DVCLIVE = True

    checkpoint_ok: bool  # the checkpoint validator found no error
    checkpoint_errors: int  # its errors
    checkpoint_warnings: int  # its warnings
    # tokens per target step (chained greedy speculative decoding, ours; prefill excluded)
    acceptance_length: float | None = headline()
    vllm_style_acceptance_length: float | None  # 1 + accepted / drafts, as vLLM counts
    per_position_rate: list[float | None]  # accepted at draft position i / steps
    per_position_conditional: list[float | None]  # / steps that reached position i
    accepted_per_pos: list[int]  # accepted tokens per draft position
    k: int  # draft tokens per step
    prompts: int  # held-out prompts decoded
    tokens: int  # tokens generated
    verification_steps: int  # target forwards that verified a draft
    max_new_tokens: int  # validate.max_new_tokens
    lossless: bool | None = headline()  # speculative output == plain greedy, every prompt
    lossless_prompts: int  # prompts where it was
    divergences: list[dict[str, Any]]  # where it was not: prompt, position, top-2 margin
    device: str  # where our decoder ran
    dtype: str  # in which dtype
    # The prompt sets measured (validate.prompt_sets); the figures above pool them all.
    prompt_sets: list[str] = optional()
    # Acceptance length per prompt set: vLLM's counters' with validate.vllm, else ours
    # (1 + accepted / drafts, vLLM's definition); K above, temperature 0, one stream.
    acceptance_by_set: dict[str, float | None] | None = optional(headline=True)
    # Per set: ours and vLLM's figures, per-position rates, per turn (MT-Bench's two)
    # and per category (MT-Bench's eight) -- see validate/by_set.py
    sets: dict[str, Any] | None = optional()
    # validate.vllm: target + draft and target alone in real vLLM
    vllm_acceptance_length: float | None = optional()  # from vLLM's spec-decode counters
    vllm_per_position_rate: list[float | None] | None = optional()  # vLLM's per position
    vllm_lossless: bool | None = optional()  # vLLM's greedy with the draft == without it
    vllm_tokens_per_s_with_draft: float | None = optional()  # single stream
    vllm_tokens_per_s_without_draft: float | None = optional()  # single stream
    vllm_speedup: float | None = optional(headline=True)  # with / without the draft
    # validate.k_sweep: the K with the best single-stream speedup, and that speedup
    vllm_best_k: int | None = optional(headline=True)
    vllm_best_k_speedup: float | None = optional(headline=True)
    # validate.temperature: vLLM's acceptance length per prompt set in the draft engine's
    # sampled pass (its rejection sampler decides; K above, one stream), and pooled. This
    # and the two concurrency fields are set beside benchmark prompt sets only (on the
    # held-out set alone they stay in ``vllm``: sampled, concurrency)
    acceptance_by_set_sampled: dict[str, float | None] | None = optional(headline=True)
    vllm_sampled_acceptance_length: float | None = optional()
    # validate.concurrency: vLLM's output tokens/s with / without the draft per number of
    # requests in flight ("1" is vllm_speedup), and the lowest level measured where that is
    # below 1: the draft stops paying there (null: it pays at every level measured)
    vllm_speedup_by_concurrency: dict[str, float | None] | None = optional(headline=True)
    vllm_break_even_concurrency: int | None = optional(headline=True)
    vllm: dict[str, Any] | None = optional()  # every vLLM figure, commands and workarounds
