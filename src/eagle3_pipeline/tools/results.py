"""``eagle3-results``: the measured figures the documentation quotes, from the runs' own
metrics files, with the commit and the machine that measured each.

Why: figures typed into prose by hand drift (a README held figures of more than ten
commits side by side, and none could be re-checked from the repository). Here a measured
run is kept as its own records -- ``results/<name>/`` holds the stages' details files
(``metrics/details/*.json``) copied from the run's work directory, and ``run.yaml`` says
what was run, by which command, at which commit -- and ``docs/results.md`` is generated
from them: the machine comes from preflight's record of it (CPU model, native bf16,
cores; the GPUs where the run used them), every acceptance figure names its prompt sets,
K, temperature and requests in flight. ``eagle3-results --check`` (a test runs it) fails
when the page and the records disagree.

    eagle3-results add NAME --workdir DIR --what "..." --command "..."   # keep a run
    eagle3-results                                                        # rewrite the page
    eagle3-results --check                                                # 1 when stale
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from eagle3_pipeline.core.errors import StageError
from eagle3_pipeline.core.io import atomic_write_text
from eagle3_pipeline.preflight.record import PreflightRecord
from eagle3_pipeline.targets.record import TargetRecord
from eagle3_pipeline.train.record import TrainRecord
from eagle3_pipeline.validate.record import ValidateRecord

RESULTS = Path("results")
PAGE = Path("docs/results.md")
# the details files a kept run holds (each stage's record; extract's and prepare's figures
# are not quoted)
KEPT = ("preflight", "target", "train", "validate")


class ResultsError(RuntimeError):
    """A kept run that cannot be read or a run that cannot be kept: one line."""


@dataclass(frozen=True)
class Run:
    """One kept run: what was run and its stages' records."""

    name: str
    what: str  # one line: the experiment
    command: str  # how it was run
    commit: str  # the repository's commit it ran at
    preflight: PreflightRecord
    target: TargetRecord
    train: TrainRecord
    validate: ValidateRecord

    @classmethod
    def read(cls, path: Path) -> Run:
        meta_path = path / "run.yaml"
        try:
            meta = yaml.safe_load(meta_path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ResultsError(f"{meta_path}: unreadable ({exc})") from None
        missing = [k for k in ("what", "command", "commit") if not meta.get(k)]
        if missing:
            raise ResultsError(f"{meta_path}: no {', '.join(missing)}")
        return cls(
            name=path.name,
            what=str(meta["what"]),
            command=str(meta["command"]),
            commit=str(meta["commit"]),
            preflight=PreflightRecord.read(path / "preflight.json"),
            target=TargetRecord.read(path / "target.json"),
            train=TrainRecord.read(path / "train.json"),
            validate=ValidateRecord.read(path / "validate.json"),
        )

    def machine(self) -> str:
        """The machine as preflight recorded it."""
        p = self.preflight
        if p.mode == "cuda" and p.gpus:
            names = sorted({g.name for g in p.gpus})
            return f"{len(p.gpus)} x {', '.join(names)}"
        cpu = p.cpu
        cores = f", {cpu.cores} cores" if cpu.cores else ""
        return f"{cpu.model or 'unknown CPU'} (native bf16: {cpu.bf16}{cores})"


def _f(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _conditions(v: ValidateRecord) -> str:
    """The prompt sets, K, temperature and concurrency the greedy figures are measured at."""
    sets = ", ".join(v.prompt_sets or ["heldout"])
    conc = v.vllm.proof_concurrency if v.vllm and v.vllm.proof_concurrency else 1
    return f"{sets}; K={v.k}, T=0, {v.max_new_tokens} new tokens at most, concurrency {conc}"


def section(run: Run) -> list[str]:
    """The page's section for one kept run."""
    v, t = run.validate, run.train
    lines = [
        f"## {run.name}",
        "",
        f"{run.what}",
        "",
        f"- commit `{run.commit}`, {run.machine()}",
        f"- command: `{run.command}`",
        f"- target: {run.target.name} ({run.target.architecture}, {run.target.num_layers} layers)",
        f"- train: {t.steps} steps, val loss {_f(t.val_loss, 4)}, "
        f"{t.tokens_per_s:.0f} training tokens/s",
        f"- prompts: {_conditions(v)}",
        "",
        "| figure | value |",
        "|---|---|",
        f"| acceptance length, our evaluator (tokens per target step) | "
        f"{_f(v.acceptance_length)} ({v.ours.prompts} prompts, {v.ours.tokens} tokens) |",
        f"| the same counted as vLLM counts (1 + accepted / drafts) | "
        f"{_f(v.ours.vllm_style_acceptance_length)} |",
        f"| lossless (our evaluator, {v.dtype}) | {v.lossless_prompts} of {v.ours.prompts} |",
    ]
    if v.vllm is not None:
        g = v.vllm
        lines += [
            f"| acceptance length, vLLM's counters | {_f(g.mean_acceptance_length)} |",
            f"| lossless in vLLM ({g.dtype}) | {g.lossless_prompts} of {g.prompts} |",
            f"| tokens/s, one request in flight ({g.speed_dtype()}), without -> with the "
            f"draft | {_f(g.tokens_per_s_without_draft, 1)} -> "
            f"{_f(g.tokens_per_s_with_draft, 1)} |",
            f"| speedup, one request in flight | {_f(g.speedup, 2)}x |",
        ]
        if g.sampled is not None:
            s = g.sampled
            lines.append(
                f"| acceptance length at T={s.temperature} (vLLM, concurrency "
                f"{s.concurrency or 1}) | {_f(s.mean_acceptance_length)} |"
            )
        if g.concurrency is not None:
            for r in g.concurrency.levels:
                if r.concurrency > 1:
                    lines.append(
                        f"| speedup, {r.concurrency} requests in flight | {_f(r.speedup, 2)}x |"
                    )
    for name, value in (v.acceptance_by_set or {}).items():
        lines.append(f"| acceptance length, {name} (K={v.k}, T=0) | {_f(value)} |")
    return lines + [""]


def render(root: Path = RESULTS) -> str:
    """``docs/results.md`` from every kept run under ``root``, by name."""
    runs = [Run.read(p) for p in sorted(root.iterdir()) if p.is_dir()] if root.is_dir() else []
    lines = [
        "# Measured results",
        "",
        "Generated by `eagle3-results` from the kept runs' own records (`results/<run>/`:",
        "each stage's `metrics/details/*.json` and `run.yaml`); do not edit. Each run names",
        "its commit and the machine that measured it; `eagle3-results --check` fails when",
        "this page and the records disagree. Keep a run with `eagle3-results add`.",
        "",
    ]
    if not runs:
        lines.append("No run kept yet.")
    for run in runs:
        lines += section(run)
    return "\n".join(lines).rstrip("\n") + "\n"


def add(name: str, workdir: Path, what: str, command: str, root: Path = RESULTS) -> Path:
    """Keep the run in ``workdir`` as ``root/name``: its records and what it was."""
    details = workdir / "metrics" / "details"
    missing = [s for s in KEPT if not (details / f"{s}.json").is_file()]
    if missing:
        raise ResultsError(
            f"{details}: no {', '.join(f'{s}.json' for s in missing)} (run the whole graph there)"
        )
    try:
        commit = subprocess.run(
            ["git", "-C", str(workdir), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        raise ResultsError(f"{workdir}: not a git work tree (the commit names the run)") from None
    out = root / name
    tmp = root / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for stage in KEPT:
        shutil.copyfile(details / f"{stage}.json", tmp / f"{stage}.json")
    (tmp / "run.yaml").write_text(
        yaml.safe_dump({"what": what, "command": command, "commit": commit}, sort_keys=False),
        encoding="utf-8",
    )
    Run.read(tmp)  # readable, or refused before it replaces anything
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="eagle3-results",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    sub = parser.add_subparsers(dest="cmd")
    keep = sub.add_parser("add", help="keep a run's records under results/NAME")
    keep.add_argument("name")
    keep.add_argument("--workdir", type=Path, required=True, help="the run's repository copy")
    keep.add_argument("--what", required=True, help="one line: the experiment")
    keep.add_argument("--command", required=True, help="the command that ran it")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "add":
            print(f"eagle3-results: kept {add(args.name, args.workdir, args.what, args.command)}")
        text = render()
    except (ResultsError, StageError, OSError) as exc:
        print(f"error: eagle3-results: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    current = PAGE.read_text(encoding="utf-8") if PAGE.is_file() else None
    if args.check:
        if current != text:
            print(
                f"eagle3-results: {PAGE} differs from the kept runs; run eagle3-results",
                file=sys.stderr,
            )
            raise SystemExit(1)
        return
    if current != text:
        atomic_write_text(PAGE, text)
        print(f"eagle3-results: {PAGE} rewritten")


if __name__ == "__main__":
    main()
