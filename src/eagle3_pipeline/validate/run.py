"""Validate a trained draft: will vLLM load it correctly, were the GPUs left clean, and
how many tokens per target step does it really buy?

:func:`validate_draft` runs the checks and measurements the validate stage reports on and
returns its metrics and the context its report and model card are rendered from
(:func:`eagle3_pipeline.validate.report.validation_files`). It fails when the checkpoint validator
finds errors, or when float32 speculative decoding is not lossless.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_pipeline.core.choices import Evaluator
from eagle3_pipeline.core.errors import StageError
from eagle3_pipeline.core.metrics import details_path
from eagle3_pipeline.core.portable import portable
from eagle3_pipeline.runtime.precision import Precision
from eagle3_pipeline.targets.adapter import TargetSpec
from eagle3_pipeline.validate.acceptance import AcceptanceResult, Prompt
from eagle3_pipeline.validate.by_set import figures_by_set, headline_by_set
from eagle3_pipeline.validate.facts import DataFacts, DraftFacts, ReportFacts, TargetFacts
from eagle3_pipeline.validate.prompt_sets import EvalPrompt
from eagle3_pipeline.validate.record import (
    EngineWorkaround,
    SetFigures,
    ValidateRecord,
    VllmFigures,
)
from eagle3_pipeline.validate.view import ValidateInputs

if TYPE_CHECKING:  # types only: the vLLM side is imported where it runs
    from eagle3_pipeline.serving.engine import Engine
    from eagle3_pipeline.serving.offline import Pass
    from eagle3_pipeline.serving.result import Counters, VllmRun
    from eagle3_pipeline.validate.engines import EnginePlan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ValidatePaths:
    """The files the stage reads and writes, from ``paths.*``."""

    target_json: Path  # the target stage's record
    draft: Path  # the trained draft (speculators format)
    prompts: Path  # the held-out prompts prepare set aside
    out: Path  # the report, model card and plots
    metrics: Path  # the details record (metrics/details/validate.json)
    live: Path  # dvclive's directory for this stage

    @classmethod
    def from_config(cls, cfg: ValidateInputs) -> ValidatePaths:
        paths = cfg.paths
        return cls(
            target_json=Path(paths.target) / "target.json",
            draft=Path(paths.draft),
            prompts=Path(paths.heldout) / "prompts.jsonl",
            out=Path(paths.validate),
            metrics=details_path(cfg, "validate"),
            live=Path(paths.live) / "validate",
        )


def draft_facts(draft_dir: Path) -> DraftFacts:
    """Shape facts for the model card, read from the draft's own config.json (the train
    stage's metrics are volatile readings and never feed this stage)."""
    try:
        conf = json.loads((draft_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return DraftFacts(shape=None, vocab_size=None)
    layer = conf.get("transformer_layer_config") or {}
    shape = {
        k: layer[k]
        for k in (
            "model_type",
            "num_hidden_layers",
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
        )
        if k in layer
    }
    return DraftFacts(shape=shape or None, vocab_size=conf.get("draft_vocab_size"))


def target_dir(spec: TargetSpec) -> str:
    """The target's local directory: the target stage always records one (a target.json
    without it was not written by this pipeline's target stage)."""
    if not spec.path:
        raise StageError(f"target {spec.name}: target.json records no local path (rerun target)")
    return spec.path


def stop_token_ids(model_dir: str | Path) -> list[int]:
    from eagle3_pipeline.draft.shape import REASONING_MARKER_CANDIDATES, special_token_ids

    return sorted(
        {
            tid
            for name, tid in special_token_ids(model_dir).items()
            if name not in REASONING_MARKER_CANDIDATES
        }
    )


@dataclass(frozen=True)
class CheckpointVerdict:
    """The checkpoint validator's verdict as the stage uses it."""

    errors: int
    warnings: int
    speculative_tokens: int | None  # K from the checkpoint's config
    serve_command: str | None
    findings: list[str]  # warnings and errors, one line each


def check_checkpoint(draft_dir: Path, spec: TargetSpec) -> CheckpointVerdict:
    """Refuse a checkpoint with errors (naming the first three); else its verdict."""
    from eagle3_pipeline.validate.checkpoint import validate_checkpoint

    report = validate_checkpoint(draft_dir, spec, verifier_dir=spec.path)
    for line in report.format().splitlines():
        log.info("checkpoint: %s", line)
    if not report.ok:
        raise StageError(
            f"{draft_dir}: the checkpoint validator found "
            f"{len(report.errors)} error(s): " + "; ".join(f.line() for f in report.errors[:3])
        )
    k = report.facts.get("speculative_tokens")
    return CheckpointVerdict(
        errors=len(report.errors),
        warnings=len(report.warnings),
        speculative_tokens=None if k is None else int(k),
        serve_command=report.serve_command,
        findings=[f.line() for f in report.findings if f.level != "info"],
    )


def load_tokenizer(spec: TargetSpec) -> Any:
    """The target's tokenizer (it renders the benchmark prompts and MT-Bench's turn 2)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        str(spec.path or spec.hub_id), trust_remote_code=bool(spec.trust_remote_code)
    )


def measure_acceptance(
    cfg: ValidateInputs,
    spec: TargetSpec,
    draft_dir: Path,
    prompts_path: Path,
    k: int,
    device: str,
    dtype: str,
) -> tuple[AcceptanceResult, list[EvalPrompt], list[Any]]:
    """Our evaluator on every prompt set: the first turns, then (MT-Bench) the second turns
    asked after the target's own first answers. Returns the pooled result, the prompts
    decoded (first turns, then second turns) and each one's result."""
    import torch

    from eagle3_pipeline.draft.checkpoint import load_trained_draft
    from eagle3_pipeline.validate import replay
    from eagle3_pipeline.validate.acceptance import SpeculatorsDraft, Target, measure, pool
    from eagle3_pipeline.validate.prompt_sets import load_first_turns, second_turns

    v = cfg.validate
    names = [str(s) for s in v.prompt_sets]
    tokenizer = load_tokenizer(spec) if names != ["heldout"] else None
    first = load_first_turns(
        names, prompts_path, tokenizer, v.num_prompts, cfg.seed, spec.vocab_size
    )
    stops = stop_token_ids(target_dir(spec))
    target = Target.load(spec, dtype, device, cfg.hardware.gpu_count)
    try:
        model = load_trained_draft(
            draft_dir, target_dir(spec), attn_implementation="sdpa", device=device
        )
        draft = SpeculatorsDraft(model, device=target.device, dtype=getattr(torch, dtype))

        def decode(prompts: list[EvalPrompt]) -> list[Any]:
            batch = [Prompt(p.id, p.prompt_ids) for p in prompts]
            if v.evaluator == Evaluator.replay:
                _, results = replay.measure(
                    target, draft, batch, k, v.max_new_tokens, stops, v.batch_size, progress=True
                )
                return results
            _, results = measure(
                target,
                draft,
                batch,
                k,
                v.max_new_tokens,
                stops,
                check_lossless=True,
                progress=True,
                kv_cache=v.kv_cache,
            )
            return results

        results = decode(first)
        prompts = list(first)
        pending = [p for p in first if p.next_questions]
        while pending:  # MT-Bench: each next turn after the target's own answer
            answers = {id(p): r.tokens for p, r in zip(prompts, results, strict=True)}
            nxt = second_turns(pending, [answers[id(p)] for p in pending], tokenizer, set(stops))
            log.info("%d next-turn prompts after the target's own answers", len(nxt))
            results += decode(nxt)
            prompts += nxt
            pending = [p for p in nxt if p.next_questions]
    finally:
        target.close()
    return pool(results, k, v.max_new_tokens), prompts, results


@dataclass(frozen=True)
class VllmPlan:
    """What the vLLM measurement will run, decided before any engine starts."""

    ids: list[list[int]]  # every prompt decoded (first turns, then next turns)
    labels: list[str]  # each prompt's group: vLLM's counters are summed per group
    subset: tuple[int, ...] | None  # the prompts timed (validate.speed_prompts; None: all)
    timed: int  # how many
    levels: list[int]  # the concurrency levels above 1 measured
    skipped: list[int]  # those left out: fewer timed prompts than requests in flight
    counting: int  # requests in flight in the counting (sampled) pass
    serving: Precision  # the speed figures' precision
    plans: list[EnginePlan]  # each engine and its passes (validate/engines.py)
    proof: tuple[EnginePlan, EnginePlan]  # with the draft, without it
    speed: tuple[EnginePlan, EnginePlan]
    engines: dict[str, Engine]  # by plan name
    stops: list[int]  # the target's stop tokens
    k_sweep: list[int]  # the further K each get an engine of their own (validate.k_sweep)

    @property
    def two_pairs(self) -> bool:
        """The speed has engines of its own (another precision than the proof's)."""
        return self.speed[0].name != self.proof[0].name


def plan_vllm(
    cfg: ValidateInputs,
    spec: TargetSpec,
    draft_dir: Path,
    prompts: list[EvalPrompt],
    k: int,
    dtype: str,
) -> VllmPlan:
    """The engines and passes of the measurement (``dtype``: the proof's precision; the
    speed is measured in :meth:`ValidateInputs.serving_precision`, on engines of its own
    where that differs: :mod:`eagle3_pipeline.validate.engines`)."""
    from eagle3_pipeline.serving.engine import build_engine
    from eagle3_pipeline.validate.engines import pair, plan_engines
    from eagle3_pipeline.validate.sweeps import concurrency_plan, speed_subset

    v = cfg.validate
    ids = [list(p.prompt_ids) for p in prompts]
    subset = speed_subset(len(ids), v.speed_prompts)
    timed = len(ids) if subset is None else len(subset)
    levels, skipped = concurrency_plan(v.concurrency, timed)
    if skipped:
        log.warning(
            "validate.concurrency: %s skipped: only %d prompts are timed, fewer than the "
            "requests that would be in flight (raise validate.num_prompts or "
            "validate.speed_prompts, or add prompt sets)",
            skipped,
            timed,
        )
    proof = Precision(dtype, cfg.precision()[1].why)
    serving = cfg.serving_precision()
    counting = v.counting_concurrency if v.vllm_mode == "offline" else v.server.concurrency
    plans = plan_engines(proof, serving, v.temperature, cfg.seed, levels, counting, subset)
    seqs = max(v.concurrency)  # the engines admit the largest level measured
    engines = {
        p.name: build_engine(
            cfg,
            spec,
            target_dir(spec),
            "validate" if p.draft else "baseline",
            dtype=p.dtype,
            draft_dir=draft_dir if p.draft else None,
            k=k if p.draft else None,
            max_num_seqs=seqs,
        )
        for p in plans
    }
    plan = VllmPlan(
        ids=ids,
        labels=[p.group for p in prompts],
        subset=subset,
        timed=timed,
        levels=list(levels),
        skipped=list(skipped),
        counting=counting,
        serving=serving,
        plans=list(plans),
        proof=pair(plans, speed=False),
        speed=pair(plans, speed=True),
        engines=engines,
        stops=stop_token_ids(target_dir(spec)),
        k_sweep=sorted(set(v.k_sweep or ()) - {k}),
    )
    if plan.two_pairs:
        log.info(
            "vLLM: the proof (counters, losslessness) in %s, every speed figure in %s (%s): "
            "a pair of engines each",
            proof.dtype,
            serving.dtype,
            serving.why,
        )
    return plan


@dataclass(frozen=True)
class VllmRuns:
    """What the engines gave back."""

    by_engine: dict[str, VllmRun]  # by plan name
    k_sweep: dict[int, VllmRun]  # the draft at each further K, over the timed prompts


def run_vllm(cfg: ValidateInputs, spec: TargetSpec, draft_dir: Path, plan: VllmPlan) -> VllmRuns:
    """Run every engine of ``plan`` (offline or served, per ``validate.vllm_mode``)."""
    from eagle3_pipeline.serving.engine import build_engine
    from eagle3_pipeline.serving.env import find_python

    python = find_python(cfg.vllm.python)
    by_engine = {
        p.name: _run_engine(
            cfg, python, plan, p.name, plan.engines[p.name], p.passes, p.concurrency, p.subset
        )
        for p in plan.plans
    }
    speed_dtype = plan.speed[0].dtype
    k_sweep = {
        kk: _run_engine(
            cfg,
            python,
            plan,
            f"k{kk}",
            build_engine(
                cfg,
                spec,
                target_dir(spec),
                "validate",
                dtype=speed_dtype,
                draft_dir=draft_dir,
                k=kk,
            ),
            chosen=plan.subset,  # the single stream's prompts
        )
        for kk in plan.k_sweep
    }
    return VllmRuns(by_engine=by_engine, k_sweep=k_sweep)


def _run_engine(
    cfg: ValidateInputs,
    python: str | Path,
    plan: VllmPlan,
    name: str,
    engine: Engine,
    extra: Sequence[Pass] = (),
    concurrency: int = 1,
    chosen: tuple[int, ...] | None = None,
) -> VllmRun:
    from eagle3_pipeline.serving.engine import log_file
    from eagle3_pipeline.serving.offline import run_offline
    from eagle3_pipeline.validate.vllm import run_served

    v = cfg.validate
    log_path = log_file(cfg, f"validate_{name}")
    if v.vllm_mode == "offline":
        res = run_offline(
            python,
            engine,
            plan.ids,
            v.max_new_tokens,
            plan.stops,
            log_path,
            timeout_s=cfg.vllm.startup_timeout_s + 3600 * (1 + len(extra)),
            labels=plan.labels,
            passes=extra,
            concurrency=concurrency,
            subset=chosen,
        )
    else:  # the served main pass keeps validate.server.concurrency
        res = run_served(
            python,
            engine,
            v.server.port,
            plan.ids,
            v.max_new_tokens,
            plan.stops,
            log_path,
            cfg.vllm.startup_timeout_s,
            cfg.vllm.shutdown_timeout_s,
            v.server.concurrency,
            labels=plan.labels,
            passes=extra,
            subset=chosen,
        )
    log.info(
        "vLLM %s (%s): %d tokens at %.1f tokens/s (engine ready in %.0f s)",
        name,
        engine.dtype,
        res.generated_tokens,
        res.tokens_per_s or 0.0,
        res.load_s or 0.0,
    )
    for pname, pres in res.passes.items():
        log.info(
            "vLLM %s (%s), pass %s: %d tokens at %.1f tokens/s",
            name,
            engine.dtype,
            pname,
            pres.generated_tokens,
            pres.tokens_per_s or 0.0,
        )
    return res


def assemble_vllm(
    cfg: ValidateInputs,
    plan: VllmPlan,
    runs: VllmRuns,
    prompts: list[EvalPrompt],
    k: int,
    dtype: str,
    ours: AcceptanceResult,
) -> tuple[VllmFigures, dict[str, Counters]]:
    """vLLM's figures from the runs, beside ``ours``; with vLLM's counters per prompt label
    of the greedy single-stream (proof) pass."""
    from eagle3_pipeline.validate.engines import single_stream
    from eagle3_pipeline.validate.record import EnginePair
    from eagle3_pipeline.validate.sweeps import (
        SAMPLED,
        concurrency_figures,
        level_name,
        sampled_figures,
    )
    from eagle3_pipeline.validate.vllm import compare, k_sweep_figures, serving_greedy

    v = cfg.validate
    (proof_d, proof_p), (speed_d, speed_p) = plan.proof, plan.speed
    run_d, run_p = runs.by_engine[speed_d.name], runs.by_engine[speed_p.name]
    # the single-stream passes the speed comes from (a pass of their own over
    # validate.speed_prompts where the main pass is also the proof over every prompt)
    with_draft, without_draft = single_stream(speed_d, run_d), single_stream(speed_p, run_p)
    out = compare(
        ours,
        runs.by_engine[proof_d.name],
        runs.by_engine[proof_p.name],
        k,
        (with_draft, without_draft),
        EnginePair(run_d.load_s, run_p.load_s),
    )
    if plan.two_pairs:
        out.serving_greedy = serving_greedy(with_draft, without_draft)
    if v.temperature is not None:
        out.sampled = sampled_figures(
            run_d.passes[SAMPLED], v.temperature, cfg.seed, prompts, concurrency=plan.counting
        )
    out.concurrency = concurrency_figures(
        {1: with_draft, **{c: run_d.passes[level_name(c)] for c in plan.levels}},
        {1: without_draft, **{c: run_p.passes[level_name(c)] for c in plan.levels}},
        plan.skipped,
    )
    if v.k_sweep:  # the same draft at each K; the same run without it as the baseline
        out.k_sweep, best = k_sweep_figures({k: with_draft, **runs.k_sweep}, without_draft)
        out.best_k = None if best is None else best.k
        out.best_k_speedup = None if best is None else best.speedup
    out.mode = str(v.vllm_mode)
    # requests in flight in the proof's pass (the served path runs every pass it starts
    # at validate.server.concurrency)
    out.proof_concurrency = proof_d.concurrency if v.vllm_mode == "offline" else plan.counting
    out.speed_prompts = plan.timed
    out.dtype = dtype
    out.serving_dtype, out.serving_dtype_why = speed_d.dtype, plan.serving.why
    out.commands = {name: portable(e.shell(v.server.port)) for name, e in plan.engines.items()}
    out.workarounds = {
        name: EngineWorkaround(
            env=dict(e.env),
            compilation_config=e.compilation_config,
            # what our vLLM plugins patched in that engine (offline mode reports it)
            patches=runs.by_engine[name].vllm_patches,
        )
        for name, e in plan.engines.items()
    }
    return out, runs.by_engine[proof_d.name].group_counters


def measure_vllm(
    cfg: ValidateInputs,
    spec: TargetSpec,
    draft_dir: Path,
    prompts: list[EvalPrompt],
    k: int,
    dtype: str,
    ours: AcceptanceResult,
) -> tuple[VllmFigures, dict[str, Counters]]:
    """Target + draft and target alone in real vLLM (see :mod:`eagle3_pipeline.validate.vllm`):
    plan the engines, run them, assemble the figures; a failure of any is one
    :class:`StageError` line."""
    from eagle3_pipeline.serving.env import VllmEnvError
    from eagle3_pipeline.serving.offline import VllmRunError
    from eagle3_pipeline.validate.vllm import VllmError

    try:
        plan = plan_vllm(cfg, spec, draft_dir, prompts, k, dtype)
        runs = run_vllm(cfg, spec, draft_dir, plan)
        return assemble_vllm(cfg, plan, runs, prompts, k, dtype, ours)
    except (VllmEnvError, VllmRunError, VllmError, OSError) as exc:
        raise StageError(f"vLLM validation failed: {exc}") from None


def check_vllm_agreement(vllm: VllmFigures, dtype: str, cfg: ValidateInputs) -> None:
    """In float32 vLLM's acceptance length must equal ours and vLLM must be lossless."""
    if dtype != "float32":
        return
    diff = vllm.acceptance_length_diff
    if diff is None or abs(diff) > cfg.validate.vllm_agreement_tol:
        raise StageError(
            f"vLLM's acceptance length {vllm.mean_acceptance_length} "
            f"({vllm.num_accepted_tokens} accepted / {vllm.num_drafts} drafts, per "
            f"position {vllm.num_accepted_tokens_per_pos}) differs from ours "
            f"{vllm.ours_acceptance_length} (per position {vllm.ours_accepted_per_pos}, "
            f"{vllm.ours_verification_steps} steps) by more than "
            f"validate.vllm_agreement_tol={cfg.validate.vllm_agreement_tol}: vLLM does not "
            "use the draft the way it was trained (aux layers, norms, weights)"
        )
    if not vllm.lossless and cfg.validate.require_lossless:
        raise StageError(
            f"vLLM's greedy output with the draft differs from its output without it on "
            f"{len(vllm.differing_prompts)} of {vllm.prompts} prompts "
            f"(first: prompt {vllm.differing_prompts[0]}) in float32"
        )


def check_set_agreement(sets: dict[str, SetFigures], dtype: str, cfg: ValidateInputs) -> None:
    """In float32 each prompt set's vLLM acceptance length must equal ours too."""
    if dtype != "float32":
        return
    tol = cfg.validate.vllm_agreement_tol
    for name, fig in sets.items():
        diff = fig.acceptance_length_diff
        if diff is not None and abs(diff) > tol:
            raise StageError(
                f"prompt set {name}: vLLM's acceptance length "
                f"{_fmt(fig.vllm.mean_acceptance_length if fig.vllm else None)} differs from "
                f"ours {_fmt(fig.ours.vllm_style_acceptance_length)} by more than "
                f"validate.vllm_agreement_tol={tol}"
            )


def validate_draft(
    cfg: ValidateInputs, device: str, dtype: str
) -> tuple[ValidateRecord, ReportFacts]:
    """Check and measure the draft (``device``/``dtype`` from :func:`runtime`); return the
    record for ``paths.details``/validate.json and the facts the report adds to it."""
    from eagle3_pipeline.core.versions import installed_versions
    from eagle3_pipeline.targets.adapter import load_target_spec
    from eagle3_pipeline.validate.report import PACKAGES

    p = ValidatePaths.from_config(cfg)
    if not p.target_json.is_file():
        raise FileNotFoundError(f"{p.target_json}: not found (run the target stage)")
    if not (p.draft / "config.json").is_file():
        raise FileNotFoundError(f"{p.draft}/config.json: not found (run the train stage)")
    spec = load_target_spec(p.target_json)

    checkpoint = check_checkpoint(p.draft, spec)
    k = cfg.validate.k or checkpoint.speculative_tokens
    if not k:
        raise StageError(
            f"{p.draft}/config.json: no speculative_tokens, and validate.k is not set "
            "(set -S validate.k=3, or retrain)"
        )
    acc, prompts, results = measure_acceptance(cfg, spec, p.draft, p.prompts, k, device, dtype)
    if acc.lossless is False and dtype == "float32" and cfg.validate.require_lossless:
        d = acc.divergences[0]
        raise StageError(
            f"speculative decoding differs from plain greedy decoding in float32 on "
            f"{len(acc.divergences)} prompt(s) (first: prompt {d.prompt} at token "
            f"{d.position}, top-2 margin {d.top2_margin}): a decoding bug"
        )
    vllm: VllmFigures | None = None
    groups: dict[str, Counters] | None = None
    if cfg.validate.vllm:
        vllm, groups = measure_vllm(cfg, spec, p.draft, prompts, k, dtype, acc)
        log.info(
            "vLLM: acceptance length %s (ours %s), lossless %s in %s; %.1f -> %.1f tokens/s "
            "(speedup %.2fx) in %s",
            _fmt(vllm.mean_acceptance_length),
            _fmt(acc.vllm_style_acceptance_length),
            vllm.lossless,
            vllm.dtype,
            vllm.tokens_per_s_without_draft or 0.0,
            vllm.tokens_per_s_with_draft or 0.0,
            vllm.speedup or 0.0,
            vllm.speed_dtype(),
        )
        check_vllm_agreement(vllm, dtype, cfg)
    sets = figures_by_set(prompts, results, k, cfg.validate.max_new_tokens, groups)
    for name, fig in sets.items():
        log.info(
            "prompt set %s (%d questions, %d prompts decoded): acceptance length %s in vLLM, "
            "%s ours (K=%d, T=0, vLLM with %d request(s) in flight)",
            name,
            fig.questions,
            fig.ours.prompts,
            _fmt(fig.vllm.mean_acceptance_length if fig.vllm else None),
            _fmt(fig.ours.vllm_style_acceptance_length),
            k,
            (vllm.proof_concurrency or 1) if vllm is not None else 1,
        )
    if vllm is not None:
        check_set_agreement(sets, dtype, cfg)
        log_serving(vllm, k)

    # the serving figures join the headline beside the field's benchmarks: on the held-out
    # set alone `dvc metrics show` keeps its width (they stay in the details and report)
    benchmarks = list(sets) != ["heldout"]
    record = ValidateRecord(
        checkpoint_errors=checkpoint.errors,
        checkpoint_warnings=checkpoint.warnings,
        ours=acc.figures(),
        acceptance_length=acc.acceptance_length,
        k=k,
        max_new_tokens=acc.max_new_tokens,
        lossless=acc.lossless,
        lossless_prompts=acc.lossless_prompts,
        divergences=acc.divergences,
        device=device,
        dtype=dtype,
        dtype_why=cfg.precision()[1].why,
        prompt_sets=list(sets),
        # a headline only beside another set: heldout alone is the acceptance above
        acceptance_by_set=None if not benchmarks else headline_by_set(sets),
        sets=sets,
    )
    if vllm is not None:
        set_vllm_headline(record, vllm, benchmarks)
    facts = ReportFacts(
        draft_dir=str(p.draft),
        target=TargetFacts(
            id=spec.hub_id or f"{spec.name} (local: {spec.path})",
            name=spec.name,
            hub_id=spec.hub_id,
            revision=spec.revision,
            vllm_architecture=spec.vllm_architecture,
            aux_layer_ids=list(spec.aux_layer_ids),
        ),
        data=DataFacts(
            source=str(cfg.data.source),
            path=cfg.data.path,
            license=data_licence(cfg),
            regenerate=cfg.data.regenerate,
            samples=cfg.train.samples,
        ),
        draft=draft_facts(p.draft),
        serve_command=checkpoint.serve_command,
        findings=checkpoint.findings,
        seed=cfg.seed,
        versions=installed_versions(PACKAGES),
    )
    return record, facts


def set_vllm_headline(record: ValidateRecord, vllm: VllmFigures, benchmarks: bool) -> None:
    """vLLM's figures into the record: the single-stream ones always; the sampled
    acceptance per set, the speedup per concurrency level and the break-even level beside
    benchmark prompt sets only (on the held-out set alone they stay in ``vllm``)."""
    record.vllm = vllm
    record.vllm_speedup = vllm.speedup
    record.vllm_best_k = vllm.best_k  # with validate.k_sweep only
    record.vllm_best_k_speedup = vllm.best_k_speedup
    if benchmarks:
        record.acceptance_by_set_sampled = (
            {n: f.mean_acceptance_length for n, f in vllm.sampled.sets.items()}
            if vllm.sampled
            else None
        )
        if vllm.concurrency is not None:
            record.vllm_speedup_by_concurrency = vllm.concurrency.speedup_by_concurrency()
            record.vllm_break_even_concurrency = vllm.concurrency.break_even_concurrency


def log_serving(vllm: VllmFigures, k: int) -> None:
    """The serving precision's greedy figures (where the proof's is another), the sampled
    and concurrency figures, one line each, each naming its precision."""
    dtype = vllm.speed_dtype()
    g = vllm.serving_greedy
    if g:
        log.info(
            "vLLM in %s (T=0, K=%d, concurrency 1; reported, not judged): acceptance length "
            "%s, lossless on %d of %d prompts",
            dtype,
            k,
            _fmt(g.mean_acceptance_length),
            g.lossless_prompts,
            vllm.speed_prompts or vllm.prompts,
        )
    sampled = vllm.sampled
    if sampled:
        log.info(
            "vLLM at temperature %s (seed %s, K=%d, %d request(s) in flight, %s): acceptance "
            "length %s; %s",
            sampled.temperature,
            sampled.seed,
            k,
            sampled.concurrency or 1,
            dtype,
            _fmt(sampled.mean_acceptance_length),
            ", ".join(f"{n} {_fmt(f.mean_acceptance_length)}" for n, f in sampled.sets.items()),
        )
    conc = vllm.concurrency
    if conc is None:
        return
    for r in conc.levels:
        log.info(
            "vLLM at concurrency %d (T=0, K=%d, %s): %.1f -> %.1f tokens/s, speedup %sx, "
            "acceptance length %s",
            r.concurrency,
            k,
            dtype,
            r.tokens_per_s_without_draft or 0.0,
            r.tokens_per_s_with_draft or 0.0,
            _fmt(r.speedup),
            _fmt(r.acceptance_length),
        )
    b = conc.break_even_concurrency
    top = max(r.concurrency for r in conc.levels)
    log.info(
        "the draft %s",
        f"stops paying at concurrency {b}" if b else f"pays at every level measured (to {top})",
    )


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def data_licence(cfg: ValidateInputs) -> str:
    """The data's licence as configured (the builtin data group sets the corpus's own)."""
    return cfg.data.license
