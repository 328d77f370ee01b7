"""Which vLLM engines the validate stage starts, in which precision, and what each decodes.

vLLM gives two kinds of figure, and they want different precisions:

- **the proof**: vLLM's spec-decode counters equal to our evaluator's (pooled, per prompt
  set, per position) and its greedy output with the draft equal to its output without
  (losslessness). It is exact only where vLLM and our evaluator round alike, in float32,
  so on a CPU it is measured in float32 (:meth:`ValidateInputs.precision
  <eagle3_pipeline.validate.view.ValidateInputs.precision>`);
- **the speed**: output tokens/s with and without the draft and their ratio, at one
  stream, at each concurrency level (``validate.concurrency``) and per K
  (``validate.k_sweep``). A user serves the target in the precision the run resolved for
  it (:meth:`ValidateInputs.serving_precision
  <eagle3_pipeline.validate.view.ValidateInputs.serving_precision>`): bf16 for a real
  target on a CPU with native bf16, where the target's forward costs several times less
  than in float32 and the draft's share of each step is not the same. A float32 speedup
  is not the one that user gets.

Where the two precisions are one (the tiny target, GPUs, CPUs without native bf16,
``validate.dtype`` set) one pair of engines gives every figure, as it always did. Where
they differ, the proof pair decodes the greedy single stream alone (counters,
losslessness, the per-set figures) and a serving pair of its own decodes every pass a
speed figure comes from.

What makes the full protocols (all of MT-Bench's 160 turns and HumanEval's 164 problems)
affordable on a CPU: a pass that only counts acceptance (the proof where it is not also
the single-stream speed, the sampled pass) may run ``validate.counting_concurrency``
requests in flight,
one label (prompt set, category, turn) at a time so the counters stay per label; and the
speed figures may be measured over ``validate.speed_prompts`` of the prompts.

The sampled pass (``validate.temperature``) runs on the engine that gives the speed: it is
a figure of serving conditions with nothing of ours beside it (sampled decoding cannot be
replayed outside vLLM token for token), so nothing exact is lost by leaving float32; the
acceptance a user sees at that temperature is the one in the precision they serve in
(rounding moves the target's and the draft's probabilities that vLLM's rejection test
compares); and the pass carries a tokens/s of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eagle3_pipeline.runtime.precision import Precision
from eagle3_pipeline.serving.offline import Pass
from eagle3_pipeline.serving.result import GenerationPass, VllmRun
from eagle3_pipeline.validate.sweeps import baseline_passes, draft_passes

SERVING_PREFIX = "serving_"  # the serving pair's engine names: serving_with_draft, ...


@dataclass(frozen=True)
class EnginePlan:
    """One engine validate starts: its name, precision, role and the passes it decodes
    after its greedy single stream (:class:`~eagle3_pipeline.serving.offline.Pass`)."""

    name: str  # with_draft | without_draft (| serving_with_draft | serving_without_draft)
    draft: bool  # the target with the draft; else the target alone
    precision: Precision  # the engine's dtype and why
    proof: bool  # its greedy single stream gives the proof (counters, losslessness, sets)
    speed: bool  # its runs give the speed figures (tokens/s, concurrency, K sweep, sampled)
    passes: tuple[Pass, ...]  # decoded after the greedy main pass, in order
    # the greedy main pass: requests in flight (above 1 only where it is not the single
    # stream: a proof alone, or one pair's proof when the speed is over a subset) and the
    # prompts it decodes (None: all; a subset only where it is a speed alone)
    concurrency: int = 1
    subset: tuple[int, ...] | None = None

    @property
    def dtype(self) -> str:
        return self.precision.dtype


def split(proof: Precision, serving: Precision) -> bool:
    """Whether the speed needs engines of its own: the precisions differ (their dtypes;
    the reasons may differ where the dtype is one)."""
    return proof.dtype != serving.dtype


SINGLE = "c1"  # the single-stream speed pass where the main pass is the proof's, over all


def plan_engines(
    proof: Precision,
    serving: Precision,
    temperature: float | None,
    seed: int,
    levels: Sequence[int],
    counting: int = 1,
    subset: tuple[int, ...] | None = None,
) -> list[EnginePlan]:
    """The engines in the order they run: with the draft, then the target alone; the
    serving pair after the proof pair where :func:`split`. ``levels``: the concurrency
    levels above 1 measured (:func:`~eagle3_pipeline.validate.sweeps.concurrency_plan`);
    ``counting``: requests in flight where a pass only counts acceptance
    (``validate.counting_concurrency``); ``subset``: the prompts the speed figures are
    measured over (``validate.speed_prompts``; None: all)."""
    with_passes = draft_passes(temperature, seed, levels, counting, subset)
    alone_passes = baseline_passes(levels, subset)
    if not split(proof, serving):  # one pair: the main pass is the proof and, over all
        # prompts, the single stream; over a subset the single stream is a pass of its own
        # and the main pass only counts, so it runs ``counting`` requests in flight (a CPU
        # without native bf16 then proves the 324 prompts of the full protocols in minutes)
        single = [] if subset is None else [Pass(SINGLE, subset=subset)]
        main = 1 if subset is None else counting
        return [
            EnginePlan(
                "with_draft", True, proof, True, True, (*single, *with_passes), concurrency=main
            ),
            EnginePlan(
                "without_draft",
                False,
                proof,
                True,
                True,
                (*single, *alone_passes),
                concurrency=main,
            ),
        ]
    return [
        EnginePlan("with_draft", True, proof, True, False, (), concurrency=counting),
        EnginePlan("without_draft", False, proof, True, False, (), concurrency=counting),
        EnginePlan(
            f"{SERVING_PREFIX}with_draft",
            True,
            serving,
            False,
            True,
            tuple(with_passes),
            subset=subset,
        ),
        EnginePlan(
            f"{SERVING_PREFIX}without_draft",
            False,
            serving,
            False,
            True,
            tuple(alone_passes),
            subset=subset,
        ),
    ]


def single_stream(plan: EnginePlan, run: VllmRun) -> GenerationPass:
    """The pass of ``plan``'s engine that gives its single-stream speed: its main pass, or
    the :data:`SINGLE` pass where the main pass is the proof's over every prompt."""
    return run.passes[SINGLE] if any(p.name == SINGLE for p in plan.passes) else run


def pair(plans: Sequence[EnginePlan], speed: bool) -> tuple[EnginePlan, EnginePlan]:
    """The engines (with the draft, without it) of the proof, or of the speed."""
    chosen = [p for p in plans if (p.speed if speed else p.proof)]
    with_draft = [p for p in chosen if p.draft]
    alone = [p for p in chosen if not p.draft]
    if len(with_draft) != 1 or len(alone) != 1:
        raise ValueError(f"no single {'speed' if speed else 'proof'} pair in {plans}")
    return with_draft[0], alone[0]
