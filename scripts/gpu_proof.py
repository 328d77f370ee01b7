#!/usr/bin/env python3
"""The GPU proof: the whole pipeline on one GPU with the embedded tiny target in bf16,
every GPU fact asserted from what the stages wrote.

Run by ``scripts/gpu_proof.sh`` (see there for the commands). In a fresh working directory
(``conf/`` copied in; never the pipeline's own outputs) it runs the six stages as their
entrypoints (``python -m eagle3_pipeline.stages.<stage>``) with ``extract.backend=hf`` and
``validate.vllm=false`` -- the path that needs neither vLLM nor DVC -- and after each
stage reads its record (``metrics/details/<stage>.json``, through the record classes, so a
renamed field fails here too) and asserts what the stage did: NVML saw the profile's GPU,
extraction, training and our acceptance evaluator ran on it in bf16, GPU memory was back
to preflight's reading once the training workers exited. It prints each stage's time and
the total, and exits 1 with one line naming the first failed assertion.

With ``hardware=cpu`` the same run is a dry check on a machine without a GPU: the CUDA
facts are replaced by their CPU equivalents (device cpu, float32 as the CPU profile
trains, NVML's "no GPU" reading, no GPU reading after training) and everything else is
asserted the same.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eagle3_pipeline.core.config import Config

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
STAGES = ("preflight", "target", "prepare", "extract", "train", "validate")

# The path the proof takes; set last, after the caller's overrides, which may not change it.
FIXED = ("extract.mode=offline", "extract.backend=hf", "validate.vllm=false")
# Sized to a few minutes on 2 CPU cores and well under 10 on an H200 (the caller's
# overrides come after these and win).
SIZE = (
    "target.train_steps=200",
    "data.max_new_tokens=48",
    "train.samples=120",  # enough for the draft to predict: an acceptance length above 1
    "train.epochs=8",
    "validate.num_prompts=6",
    "validate.max_new_tokens=32",
)
# The third-party modules the stages import on this path, checked before any stage runs
# so that a missing wheel is one line, not a traceback in the middle of a stage.
MODULES = (
    "torch",
    "transformers",
    "safetensors",
    "tokenizers",
    "numpy",
    "yaml",
    "pynvml",
    "matplotlib",
    "hydra",
    "omegaconf",
    "datasets",
    "dvclive",
    "speculators",
    "eagle3_pipeline",
)
VERSIONS = ("torch", "transformers", "speculators", "datasets", "dvclive", "hydra-core")
LOG_TAIL_LINES = 25  # of a failed stage's log, printed before the one-line failure


class ProofFailure(Exception):
    """An assertion about what a stage did that does not hold: the proof's one line."""


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise ProofFailure(what)


@dataclass
class Expected:
    """What the composed config says the run must show (never read from the records)."""

    hardware: str
    device: str  # hardware.device: cuda or cpu
    gpu_count: int
    gpu_name: str | None
    model_dtype: str  # the target's dtype: extraction computes in it
    hs_dtype: str  # extract.dtype of the stored hidden states
    train_device: str
    train_dtype: str
    world_size: int
    validate_device: str
    validate_dtype: str
    num_prompts: int | None

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


@dataclass
class Context:
    cfg: Config  # the composed config
    expected: Expected
    facts: dict[str, list[str]] = field(default_factory=dict)

    def path(self, key: str) -> Path:
        """A ``paths.*`` artifact (relative to the working directory, the cwd)."""
        return Path(getattr(self.cfg.paths, key))

    def details(self, stage: str) -> Path:
        return self.path("details") / f"{stage}.json"


# --------------------------------------------------------------------------- checks


def check_preflight(ctx: Context) -> list[str]:
    from eagle3_pipeline.preflight.record import PreflightRecord

    e, rec = ctx.expected, PreflightRecord.read(ctx.details("preflight"))
    expect(rec.passed, f"passed is false: {rec.checks}")
    expect(rec.hardware == e.hardware, f"hardware {rec.hardware!r}, expected {e.hardware!r}")
    expect(rec.mode == e.device, f"mode {rec.mode!r}, expected {e.device!r}")
    expect(rec.snapshot.mode == e.device, f"snapshot mode {rec.snapshot.mode!r}")
    expect(rec.vllm is None, "the vLLM environment was probed: this path needs no vLLM")
    expect(bool(rec.packages.get("speculators")), "speculators' version not found by metadata")
    if e.cuda:
        expect(rec.no_driver is None, f"NVML could not be read: {rec.no_driver}")
        expect(bool(rec.driver_version), "no NVIDIA driver version recorded")
        expect(
            rec.gpu_count_visible == e.gpu_count == len(rec.gpus),
            f"{rec.gpu_count_visible} GPU(s) visible, {len(rec.gpus)} read, expected {e.gpu_count}",
        )
        name = rec.gpus[0].name
        expect(not e.gpu_name or e.gpu_name in name, f"GPU {name!r}, expected {e.gpu_name!r}")
        tv = rec.torch
        expect(
            tv is not None and bool(tv.cuda) and tv.device_count >= e.gpu_count,
            f"torch's view of CUDA: {tv}",
        )
        assert tv is not None
        used = [g.memory_used_mib for g in rec.snapshot.gpus]
        return [
            f"NVML: {name}, driver {rec.driver_version}, {used} MiB used",
            f"torch {tv.version} (CUDA {tv.cuda}) sees {tv.device_count} GPU(s)",
        ]
    expect(rec.no_driver is not None, "NVML found a driver: run hardware=cpu without one")
    expect(rec.gpus == [] and rec.driver_version is None, f"GPUs read: {rec.gpus}")
    return [f"NVML: no GPU ({rec.no_driver})"]


def check_target(ctx: Context) -> list[str]:
    from eagle3_pipeline.targets.record import TargetRecord

    rec = TargetRecord.read(ctx.details("target"))
    expect(rec.built, "the tiny target was not built")
    expect(rec.name == ctx.cfg.model.name, f"target {rec.name!r}, expected {ctx.cfg.model.name!r}")
    expect(rec.reload_logits_identical is True, "the saved target does not reload exactly")
    ratio = rec.perplexity_ratio_vs_unigram
    expect(ratio is not None and ratio < 1, f"perplexity ratio vs unigram {ratio}: not trained")
    expect((ctx.path("target") / "target.json").is_file(), "target.json not written")
    return [f"{rec.name}: {rec.parameters:,} parameters, perplexity ratio {ratio:.2f}"]


def check_prepare(ctx: Context) -> list[str]:
    from eagle3_pipeline.data.record import PrepareRecord

    rec = PrepareRecord.read(ctx.details("prepare"))
    expect(rec.rows > 0 and rec.supervised_tokens > 0, f"{rec.rows} rows written")
    expect(rec.conversations_invalid == 0, f"{rec.conversations_invalid} invalid conversations")
    expect(not rec.errors, f"errors {rec.errors}")
    if ctx.cfg.data.regenerate:
        expect(rec.regenerate and rec.backend == "hf", f"regenerated by {rec.backend!r}")
    prompts = ctx.path("heldout") / "prompts.jsonl"
    expect(prompts.is_file(), f"{prompts} not written")
    return [f"{rec.rows} rows, {rec.tokens} tokens, regenerated by {rec.backend}"]


def check_extract(ctx: Context) -> list[str]:
    from eagle3_pipeline.data.record import PrepareRecord
    from eagle3_pipeline.extract.record import ExtractRecord

    e, rec = ctx.expected, ExtractRecord.read(ctx.details("extract"))
    rows = PrepareRecord.read(ctx.details("prepare")).rows
    expect((rec.mode, rec.backend) == ("offline", "hf"), f"mode {rec.mode}, backend {rec.backend}")
    expect(rec.device == e.device, f"device {rec.device!r}, expected {e.device!r}")
    expect(
        rec.model_dtype == e.model_dtype,
        f"model dtype {rec.model_dtype!r}, expected {e.model_dtype!r}",
    )
    expect(rec.dtype == e.hs_dtype, f"stored dtype {rec.dtype!r}, expected {e.hs_dtype!r}")
    expect(rec.samples == rows == rec.samples_written, f"{rec.samples_written} of {rows} rows")
    files = len(list(ctx.path("hidden_states").glob("hs_*.safetensors")))
    expect(files == rows, f"{files} hidden-state files for {rows} rows")
    facts = [f"{rows} rows on {rec.device} in {rec.model_dtype}, {rec.tokens_per_s:.0f} tokens/s"]
    if e.cuda:
        peak = rec.peak_gpu_memory_bytes or 0
        expect(peak > 0, f"peak GPU memory {rec.peak_gpu_memory_bytes}: nothing ran on the GPU")
        facts.append(f"peak GPU memory {peak / 2**20:.0f} MiB")
    return facts


def check_train(ctx: Context) -> list[str]:
    from eagle3_pipeline.train.record import TrainRecord

    e, rec = ctx.expected, TrainRecord.read(ctx.details("train"))
    expect(rec.device == e.train_device, f"device {rec.device!r}, expected {e.train_device!r}")
    expect(rec.dtype == e.train_dtype, f"dtype {rec.dtype!r}, expected {e.train_dtype!r}")
    expect(rec.world_size == e.world_size, f"{rec.world_size} workers, expected {e.world_size}")
    expect(rec.steps > 0 and rec.steps == rec.total_steps, f"{rec.steps}/{rec.total_steps} steps")
    expect(math.isfinite(rec.val_loss), f"val loss {rec.val_loss}")
    if rec.val_loss_untrained is not None:
        expect(
            rec.val_loss < rec.val_loss_untrained,
            f"val loss {rec.val_loss:.4f} not below the untrained {rec.val_loss_untrained:.4f}",
        )
    summary = ctx.path("live") / "train" / "metrics.json"
    expect(summary.is_file(), f"{summary}: dvclive's summary not written")
    expect("tokens_per_s" in json.loads(summary.read_text()), f"{summary} has no tokens_per_s")
    facts = [f"{rec.steps} steps on {rec.device} in {rec.dtype}, val loss {rec.val_loss:.4f}"]
    if e.cuda:
        expect(rec.launcher is not None, "no torchrun launch recorded")
        gpu = rec.gpu
        after = gpu.after_workers_exit
        expect(after is not None and after.mode == "cuda", f"NVML after the workers exited: {gpu}")
        expect(gpu.compared_with_preflight is True, "not compared with preflight's reading")
        expect(
            rec.gpu_released is True and gpu.clean is True,
            f"GPU memory not released: {gpu.problems}",
        )
        expect(rec.peak_memory_mib > 0, f"peak CUDA memory {rec.peak_memory_mib} MiB")
        used = [g.memory_used_mib for g in after.gpus] if after else []
        facts.append(
            f"GPU memory released: {used} MiB used after the workers exited "
            f"(peak {rec.peak_memory_mib:.0f} MiB)"
        )
        return facts
    expect(rec.gpu.mode == "not applicable", f"GPU reading on CPU: {rec.gpu}")
    expect(rec.gpu_released is None, f"gpu_released {rec.gpu_released} on CPU")
    facts.append(f"no GPU reading ({rec.gpu.reason})")
    return facts


def check_validate(ctx: Context) -> list[str]:
    from eagle3_pipeline.validate.record import ValidateRecord

    e, rec = ctx.expected, ValidateRecord.read(ctx.details("validate"))
    expect(rec.checkpoint_errors == 0, f"{rec.checkpoint_errors} errors")
    expect(
        rec.device == e.validate_device, f"device {rec.device!r}, expected {e.validate_device!r}"
    )
    expect(rec.dtype == e.validate_dtype, f"dtype {rec.dtype!r}, expected {e.validate_dtype!r}")
    heldout = ctx.path("heldout") / "prompts.jsonl"
    n = sum(1 for line in heldout.read_text(encoding="utf-8").splitlines() if line.strip())
    want = min(n, e.num_prompts or n)
    expect(rec.ours.prompts == want > 0, f"{rec.ours.prompts} prompts decoded, expected {want}")
    a = rec.acceptance_length
    expect(a is not None and math.isfinite(a), f"acceptance length {a}: not measured")
    # above 1: the draft the trainer saved loads and proposes tokens the target accepts
    expect(
        a is not None and a > 1.0,
        f"acceptance length {a}: the target accepted none of the draft's tokens",
    )
    expect(rec.ours.tokens > 0 and rec.ours.steps > 0, f"{rec.ours.tokens} tokens generated")
    expect(rec.vllm is None, "vLLM ran: validate.vllm=false was not honoured")
    if rec.dtype == "float32":  # exact arithmetic: the stage itself fails otherwise
        expect(rec.lossless is True, f"not lossless in float32: {rec.divergences[:1]}")
    else:
        expect(rec.lossless is not None, "losslessness not checked")
    summary = ctx.path("live") / "validate" / "metrics.json"
    expect(summary.is_file(), f"{summary}: dvclive's summary not written")
    report = ctx.path("validate") / "report.md"
    expect(report.is_file(), f"{report} not written")
    return [
        f"our evaluator on {rec.device} in {rec.dtype}: acceptance length {a:.3f} at K={rec.k} "
        f"over {rec.ours.prompts} prompts ({rec.ours.tokens} tokens), lossless "
        f"{rec.lossless_prompts}/{rec.ours.prompts}"
    ]


CHECKS: dict[str, Callable[[Context], list[str]]] = {
    "preflight": check_preflight,
    "target": check_target,
    "prepare": check_prepare,
    "extract": check_extract,
    "train": check_train,
    "validate": check_validate,
}


# --------------------------------------------------------------------------- running


class UsageError(Exception):
    """Bad input to the proof itself: one line, exit 2."""


def check_user(user: list[str]) -> None:
    """The caller's overrides are ``key=value`` and leave the proof's path alone."""
    fixed_keys = {f.split("=", 1)[0] for f in FIXED}
    for o in user:
        key = o.lstrip("+~").split("=", 1)[0]
        if "=" not in o:
            raise UsageError(f"{o}: overrides are key=value (e.g. hardware=cpu)")
        if key in fixed_keys:
            raise UsageError(f"{o}: the proof's path fixes {key}; leave it out")


def overrides_for(user: list[str], device: str) -> list[str]:
    """The stages' overrides: the proof's sizes, the caller's, bf16 on CUDA unless the
    caller set the target's dtype, and the fixed path last."""
    check_user(user)
    own_dtype = any(o.startswith("model.dtype=") for o in user)
    dtype = ["model.dtype=bfloat16"] if device == "cuda" and not own_dtype else []
    return [*SIZE, *user, *dtype, *FIXED]


def compose(overrides: list[str]) -> Config:
    from eagle3_pipeline.core.config import ConfigError, load_config

    try:
        return load_config(overrides, conf_dir="conf")
    except ConfigError as exc:
        raise UsageError(f"{exc} (in the overrides given)") from None


def expected(cfg: Config) -> Expected:
    from eagle3_pipeline.core.config import validate_runtime
    from eagle3_pipeline.runtime.precision import model_precision
    from eagle3_pipeline.train.runtime import resolve_runtime
    from eagle3_pipeline.train.view import TrainInputs

    rt = resolve_runtime(TrainInputs.from_config(cfg))
    v = cfg.validate
    m = cfg.model
    target = model_precision(m.dtype, cfg.hardware.device, m.tiny is not None, cfg.paths.precision)
    v_device, v_dtype = validate_runtime(v.device, v.dtype, cfg.hardware.device, target.dtype)
    hw = cfg.hardware
    return Expected(
        hardware=hw.name,
        device=str(hw.device),
        gpu_count=hw.gpu_count,
        gpu_name=hw.gpu_name,
        model_dtype=str(target.dtype),
        hs_dtype=str(cfg.extract.dtype),
        train_device=str(rt.device),
        train_dtype=str(rt.dtype),
        world_size=rt.world_size,
        validate_device=str(v_device),
        validate_dtype=str(v_dtype),
        num_prompts=cfg.validate.num_prompts,
    )


def stage_env() -> dict[str, str]:
    """The stages' environment: this checkout's package first (absolute: the stages run
    in the working directory), no hub and no DVC analytics (there is no network)."""
    env = dict(os.environ)
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    path = [str(Path(p).resolve()) for p in path]
    if str(SRC) not in path:
        path.insert(0, str(SRC))
    env["PYTHONPATH"] = os.pathsep.join(path)
    env.update(
        PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", DVC_NO_ANALYTICS="1"
    )
    return env


IMPORT_CHECK = """
import importlib, importlib.metadata as md, sys
for name in sys.argv[2].split(","):
    try:
        mod = importlib.import_module(name)
    except Exception as exc:
        print(f"import {name}: {type(exc).__name__}: {exc}")
        raise SystemExit(1)
where = mod.__file__
if not where.startswith(sys.argv[1]):
    print(f"eagle3_pipeline comes from {where}, not this checkout's src/")
    raise SystemExit(1)
versions = []
for dist in sys.argv[3].split(","):
    try:
        versions.append(f"{dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        versions.append(f"{dist} (no metadata)")
print(f"python {sys.version.split()[0]}; " + ", ".join(versions))
"""


def check_imports(env: dict[str, str]) -> str:
    """Every module the stages import on this path, in a child (this process never loads
    torch, so it holds no CUDA context while the stages run)."""
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_CHECK, str(SRC), ",".join(MODULES), ",".join(VERSIONS)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    line = (proc.stdout.strip().splitlines() or [proc.stderr.strip()[-300:]])[-1]
    if proc.returncode != 0:
        raise ProofFailure(f"{line} (a wheel is missing: scripts/gpu_wheels.py)")
    return line


def run_stage(stage: str, overrides: list[str], env: dict[str, str], verbose: bool) -> float:
    """One stage's entrypoint in the working directory, its output in logs/proof_<stage>.log
    (streamed too with --verbose); its wall time."""
    log_path = Path("logs") / f"proof_{stage}.log"
    log_path.parent.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", f"eagle3_pipeline.stages.{stage}", *overrides]
    t0 = time.perf_counter()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out = proc.stdout
        assert isinstance(out, io.BufferedReader)
        for chunk in iter(lambda: out.read1(65536), b""):
            log.write(chunk)
            if verbose:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
        rc = proc.wait()
    wall = time.perf_counter() - t0
    if rc != 0:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        if not verbose:
            print("\n".join(lines[-LOG_TAIL_LINES:]), file=sys.stderr)
        last = next((ln for ln in reversed(lines) if ln.strip()), "")
        raise ProofFailure(f"exit code {rc} after {wall:.0f} s: {last.strip()[:300]}")
    return wall


def workdir(given: str | None) -> Path:
    """``given`` (new or empty), else a new temporary directory."""
    if not given:
        return Path(tempfile.mkdtemp(prefix="eagle3-gpu-proof."))
    work = Path(given).resolve()
    if work.exists() and (not work.is_dir() or any(work.iterdir())):
        raise UsageError(f"--workdir {work}: not an empty directory (give a new or empty one)")
    work.mkdir(parents=True, exist_ok=True)
    return work


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/gpu_proof.sh",
        description="Run the six stages on one GPU (hardware=h200_x1 unless given) with the "
        "tiny target in bf16 and assert what each recorded; hardware=cpu: the dry check.",
    )
    parser.add_argument("--workdir", help="an empty or new directory (default: a new temp one)")
    parser.add_argument("--verbose", action="store_true", help="stream every stage's output")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. hardware=cpu")
    args = parser.parse_args(argv)
    user = list(args.overrides)
    if not any(o.startswith("hardware=") for o in user):
        user.insert(0, "hardware=h200_x1")
    try:
        check_user(user)
        work = workdir(args.workdir)
    except UsageError as exc:
        print(f"error: gpu_proof: {exc}", file=sys.stderr)
        return 2
    shutil.copytree(REPO / "conf", work / "conf")
    os.chdir(work)
    sys.path.insert(0, str(SRC))
    env = stage_env()
    from eagle3_pipeline.core.records import RecordError

    t_all = time.perf_counter()
    times: dict[str, float] = {}
    stage = "imports"
    try:
        t0 = time.perf_counter()
        print(f"gpu_proof: {check_imports(env)}", flush=True)
        times["imports"] = time.perf_counter() - t0
        device = str(compose(user).hardware.device)
        overrides = overrides_for(user, device)
        cfg = compose(overrides)
        ctx = Context(cfg, expected(cfg))
        e = ctx.expected
        print(
            f"gpu_proof: {e.hardware} ({e.device}); target {cfg.model.name} in {e.model_dtype}, "
            f"training in {e.train_dtype}, evaluator in {e.validate_dtype}; work dir {work}",
            flush=True,
        )
        for stage in STAGES:
            print(f"== {stage}", flush=True)
            times[stage] = run_stage(stage, overrides, env, args.verbose)
            facts = CHECKS[stage](ctx)
            for fact in facts:
                print(f"   {fact}", flush=True)
            print(f"== {stage}: ok in {times[stage]:.1f} s", flush=True)
    except UsageError as exc:
        print(f"error: gpu_proof: {exc}", file=sys.stderr)
        return 2
    except (ProofFailure, RecordError) as exc:  # a record not written is a failed stage too
        print(f"gpu_proof: FAIL: {stage}: {exc}", file=sys.stderr)
        return 1
    total = time.perf_counter() - t_all
    print("gpu_proof: times: " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
    print(f"gpu_proof: OK: {len(STAGES)} stages on {e.hardware} ({e.device}) in {total:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
