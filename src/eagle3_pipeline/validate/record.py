"""``metrics/details/validate.json``: every figure of one validation.

Built by :func:`eagle3_pipeline.validate.run.validate_draft`; its headline fields go to
dvclive's summary (:func:`eagle3_pipeline.validate.live.write_live`) and from there to
``dvc exp show`` and ``eagle3-compare``. The vLLM figures are set with ``validate.vllm``
only, the best K with ``validate.k_sweep`` too.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_pipeline.core.records import Record, headline, optional
from eagle3_pipeline.serving.engine import CompilationConfig


@dataclass
class Divergence:
    """Where speculative decoding left plain greedy decoding on one prompt."""

    prompt: str  # the prompt's id
    position: int | None  # the first new token that differs
    top2_margin: float | None  # the target's top-2 logit margin there (a near-tie?)


@dataclass
class VllmAcceptance:
    """vLLM's spec-decode counters over some prompts, and the acceptance they give."""

    num_drafts: int  # draft rounds (verification steps)
    num_draft_tokens: int  # tokens proposed
    num_accepted_tokens: int  # tokens accepted
    num_accepted_tokens_per_pos: list[int]  # accepted at each draft position
    mean_acceptance_length: float | None  # 1 + accepted / drafts (null: no draft round)
    per_position_rate: list[float]  # accepted at position i / drafts


@dataclass
class OursFigures:
    """Our evaluator's figures over some prompts (see validate.acceptance.pool)."""

    prompts: int  # prompts decoded
    tokens: int  # tokens generated
    steps: int  # verification steps
    acceptance_length: float | None  # tokens per verification step (end effects in)
    vllm_style_acceptance_length: float | None  # 1 + accepted / steps, as vLLM counts
    accepted_per_pos: list[int]  # accepted tokens per draft position
    per_position_rate: list[float | None]  # accepted at position i / steps
    per_position_conditional: list[float | None]  # / steps that reached position i


@dataclass
class SliceFigures:
    """One slice of the prompts (a set, a turn, a category): ours and vLLM's figures."""

    ours: OursFigures  # our evaluator's
    vllm: VllmAcceptance | None = optional()  # vLLM's counters' (validate.vllm only)
    # vLLM's acceptance length minus ours (null where either has none; validate.vllm only)
    acceptance_length_diff: float | None = optional()


@dataclass
class SetFigures:
    """One prompt set's figures, with MT-Bench's per-turn and per-category slices."""

    description: str  # what the set is and where it comes from
    questions: int  # questions asked (first turns)
    ours: OursFigures  # our evaluator's, every turn
    vllm: VllmAcceptance | None = optional()  # vLLM's counters', every turn
    acceptance_length_diff: float | None = optional()  # vLLM's minus ours
    turns: dict[str, SliceFigures] | None = optional()  # per turn ("1", "2"), when several
    categories: dict[str, SliceFigures] | None = optional()  # per category, when the set has them

    def acceptance(self) -> float | None:
        """The set's headline: vLLM's counters' where vLLM ran, else ours (vLLM style)."""
        if self.vllm is not None:
            return self.vllm.mean_acceptance_length
        return self.ours.vllm_style_acceptance_length


@dataclass
class SampledFigures(VllmAcceptance):
    """vLLM's acceptance at ``temperature``: its rejection sampler decides (validate.temperature)."""

    temperature: float  # the sampling temperature
    seed: int  # prompt i is sampled with seed + i
    sets: dict[str, VllmAcceptance]  # per prompt set
    generated_tokens: int  # tokens generated in the sampled pass
    tokens_per_s: float | None  # its output tokens/s
    # requests in flight, one label's prompts at a time (validate.counting_concurrency)
    concurrency: int | None = optional()


@dataclass
class ConcurrencyLevel:
    """vLLM with and without the draft at one number of requests in flight (T=0)."""

    concurrency: int  # requests in flight
    tokens_per_s_with_draft: float | None  # output tokens/s with the draft
    tokens_per_s_without_draft: float | None  # and without it
    speedup: float | None  # with / without
    acceptance_length: float | None  # vLLM's at that level
    same_outputs: bool  # greedy outputs equal with and without (batched float may differ)
    generated_tokens: int  # tokens generated with the draft


@dataclass
class ConcurrencyFigures:
    """The concurrency sweep (validate.concurrency)."""

    levels: list[ConcurrencyLevel]  # one per level measured, 1 first
    # the lowest level measured where the speedup is below 1 (null: it pays at every one)
    break_even_concurrency: int | None
    skipped: list[int]  # levels not measured: fewer prompts than requests in flight

    def speedup_by_concurrency(self) -> dict[str, float | None]:
        """``{"1": x, "4": y, ...}``: the headline (string keys: a metrics file's keys)."""
        return {str(r.concurrency): r.speedup for r in self.levels}


@dataclass
class KSweepRow:
    """The same draft served at one K (validate.k_sweep), T=0, one stream."""

    k: int  # draft tokens per step
    acceptance_length: float | None  # vLLM's counters'
    per_position_rate: list[float]  # vLLM's per position
    tokens_per_s: float | None  # output tokens/s
    speedup: float | None  # over the same run without the draft
    lossless: bool  # greedy outputs equal to the run without the draft


@dataclass
class EnginePair:
    """One figure of each engine: the target with the draft and the target alone."""

    with_draft: float | None  # the target with the draft
    without_draft: float | None  # the target alone


@dataclass
class EngineWorkaround:
    """What one engine needed to run here (compat.vllm's workarounds)."""

    env: dict[str, str]  # environment variables set for it
    compilation_config: CompilationConfig | None  # its --compilation-config
    patches: list[str] | None  # our vLLM plugins' patches it applied (offline mode)


@dataclass
class ServingGreedy(VllmAcceptance):
    """The serving pair's own greedy single stream, where the serving precision is not the
    proof's (validate/engines.py): vLLM's acceptance in the precision a user serves in, and
    whether the draft left its greedy output unchanged there. Reported, not judged: in
    bf16 a near-tie may round one way in a step of K+1 tokens and the other in one token."""

    lossless: bool  # greedy with the draft == without it, every prompt, in that precision
    lossless_prompts: int  # prompts where it was
    generated_tokens: int  # tokens generated with the draft (the single-stream tokens/s's)


@dataclass
class VllmFigures(VllmAcceptance):
    """Every figure of the draft in real vLLM beside ours (validate.vllm)."""

    k: int  # draft tokens per step served
    ours_acceptance_length: float | None  # our evaluator's, vLLM style, same prompts
    ours_accepted_per_pos: list[int]  # ours per position
    ours_verification_steps: int  # our verification steps
    acceptance_length_diff: float | None  # vLLM's minus ours (0 in float32)
    lossless: bool  # vLLM's greedy with the draft == without it, every prompt
    lossless_prompts: int  # prompts where it was
    prompts: int  # prompts decoded
    differing_prompts: list[int]  # indexes of the prompts where it was not
    generated_tokens: int  # tokens generated with the draft (the proof's)
    tokens_per_s_with_draft: float | None  # single stream (in serving_dtype)
    tokens_per_s_without_draft: float | None  # single stream (in serving_dtype)
    speedup: float | None  # with / without
    engine_load_s: EnginePair  # seconds to a ready engine (the speed's engines)
    wall_s: EnginePair  # seconds of the generation passes the tokens/s are measured over
    sampled: SampledFigures | None = optional()  # validate.temperature
    concurrency: ConcurrencyFigures | None = optional()  # validate.concurrency
    k_sweep: list[KSweepRow] | None = optional()  # validate.k_sweep
    best_k: int | None = optional()  # the K with the best single-stream speedup
    best_k_speedup: float | None = optional()  # and that speedup
    mode: str | None = optional()  # offline (vllm.LLM) or serve (vllm serve)
    # requests in flight in the proof's pass, one label at a time (1: a single stream)
    proof_concurrency: int | None = optional()
    # prompts the speed figures are measured over (validate.speed_prompts; all: prompts)
    speed_prompts: int | None = optional()
    dtype: str | None = optional()  # the proof engines' dtype (counters, losslessness, sets)
    # The precision every speed figure was measured in (single-stream tokens/s and speedup,
    # concurrency, k_sweep, sampled): the target's, as a user serves it -- dtype itself
    # where one pair of engines gave every figure, else a serving pair of its own
    serving_dtype: str | None = optional()
    serving_dtype_why: str | None = optional()  # why that precision (the target's record)
    serving_greedy: ServingGreedy | None = optional()  # serving_dtype != dtype only
    commands: dict[str, str] | None = optional()  # each engine as a vllm serve command
    workarounds: dict[str, EngineWorkaround] | None = optional()  # per engine

    def speed_dtype(self) -> str | None:
        """The precision of the speed figures (a record from before serving_dtype: dtype)."""
        return self.serving_dtype or self.dtype


@dataclass(kw_only=True)
class ValidateRecord(Record):
    STAGE = "validate"
    HEADLINE_IN_DVCLIVE = True

    version: int = 2  # 2: our figures nested in ``ours``, vLLM's only in ``vllm``
    # the checkpoint validator's counts; a checkpoint with errors stops the stage before
    # anything is measured, so a record exists only for one it passed
    checkpoint_errors: int
    checkpoint_warnings: int  # its warnings
    # our evaluator's figures over every prompt decoded, every set pooled (chained greedy
    # speculative decoding; prefill excluded): prompts, tokens, steps, per position
    ours: OursFigures
    # tokens per target step: ``ours.acceptance_length``, here as the headline DVC shows
    acceptance_length: float | None = headline()
    k: int  # draft tokens per step
    max_new_tokens: int  # validate.max_new_tokens
    lossless: bool | None = headline()  # speculative output == plain greedy, every prompt
    lossless_prompts: int  # prompts where it was
    divergences: list[Divergence]  # where it was not
    device: str  # where our decoder ran
    dtype: str  # in which dtype (vLLM's proof engines too; its speed's: vllm.serving_dtype)
    dtype_why: str | None = optional()  # why: validate.dtype, float32 on a CPU, the target's
    # The prompt sets measured (validate.prompt_sets); the figures above pool them all.
    prompt_sets: list[str] = optional()
    # Acceptance length per prompt set: vLLM's counters' with validate.vllm, else ours
    # (1 + accepted / drafts, vLLM's definition); K above, temperature 0, one stream.
    acceptance_by_set: dict[str, float | None] | None = optional(headline=True)
    # Per set: ours and vLLM's figures, per-position rates, per turn (MT-Bench's two)
    # and per category (MT-Bench's eight) -- see validate/by_set.py
    sets: dict[str, SetFigures] | None = optional()
    # validate.vllm: target + draft and target alone in real vLLM; the headline figures
    # below are vLLM's (``vllm`` holds every one: acceptance, losslessness, tokens/s)
    vllm_speedup: float | None = optional(headline=True)  # with / without the draft
    # validate.k_sweep: the K with the best single-stream speedup, and that speedup
    vllm_best_k: int | None = optional(headline=True)
    vllm_best_k_speedup: float | None = optional(headline=True)
    # validate.temperature: vLLM's acceptance length per prompt set in the draft engine's
    # sampled pass (its rejection sampler decides; K above, one stream; pooled: vllm.sampled). This
    # and the two concurrency fields are set beside benchmark prompt sets only (on the
    # held-out set alone they stay in ``vllm``: sampled, concurrency)
    acceptance_by_set_sampled: dict[str, float | None] | None = optional(headline=True)
    # validate.concurrency: vLLM's output tokens/s with / without the draft per number of
    # requests in flight ("1" is vllm_speedup), and the lowest level measured where that is
    # below 1: the draft stops paying there (null: it pays at every level measured)
    vllm_speedup_by_concurrency: dict[str, float | None] | None = optional(headline=True)
    vllm_break_even_concurrency: int | None = optional(headline=True)
    vllm: VllmFigures | None = optional()  # every vLLM figure, commands and workarounds
