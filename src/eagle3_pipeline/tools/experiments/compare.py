"""``eagle3-compare``: acceptance length, vLLM speedup and val loss for every experiment
``dvc exp show`` lists, with the params that differ between them -- a table on stdout and a
PNG.

Why a command of ours: ``dvc exp show`` answers "what did each run get?" in a table as
wide as every param and metric of the graph; a user choosing between sample counts, epochs,
aux layers or learning rates wants three figures against the one or two params they varied.
The figures are read from DVC (``dvc exp show --json``), never recomputed: the same values
``dvc metrics show`` prints.

``--x PARAM`` turns the comparison into a curve: the acceptance figures against a numeric
param (``train.samples`` after a queued sweep: how much data buys how much acceptance) and
against what each experiment's draft cost (hours and CPU-hours, from its own stage details:
:mod:`eagle3_pipeline.tools.experiments.cost`).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# (column, metrics file below paths.live, key path in it)
FIGURES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("acceptance length", "validate/metrics.json", ("acceptance_length",)),
    ("vLLM speedup", "validate/metrics.json", ("vllm_speedup",)),
    ("MT-Bench", "validate/metrics.json", ("acceptance_by_set", "mt_bench")),
    ("HumanEval", "validate/metrics.json", ("acceptance_by_set", "humaneval")),
    ("MT-Bench T>0", "validate/metrics.json", ("acceptance_by_set_sampled", "mt_bench")),
    ("break-even C", "validate/metrics.json", ("vllm_break_even_concurrency",)),
    ("val loss", "train/metrics.json", ("val", "loss")),
    ("best K", "validate/metrics.json", ("vllm_best_k",)),  # with validate.k_sweep
    ("best-K speedup", "validate/metrics.json", ("vllm_best_k_speedup",)),
)
DEFAULT_LIVE = "dvclive"
IGNORED_PARAMS = ("paths.",)  # derived from other params: never what a user varied


@dataclass
class Experiment:
    name: str
    rev: str
    params: dict[str, Any] = field(default_factory=dict)  # flattened params.yaml
    figures: dict[str, float | None] = field(default_factory=dict)


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix[:-1]: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}."))
    return out


def _get(d: Any, keys: tuple[str, ...]) -> float | None:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return float(d) if isinstance(d, (int, float)) and not isinstance(d, bool) else None


def _experiment(state: dict[str, Any], name: str) -> Experiment | None:
    data = state.get("data") or {}
    if not data:
        return None
    params = _flatten(((data.get("params") or {}).get("params.yaml") or {}).get("data") or {})
    live = str(params.get("paths.live") or DEFAULT_LIVE).rstrip("/")
    metrics = data.get("metrics") or {}
    figures = {}
    for column, rel, keys in FIGURES:
        figures[column] = _get((metrics.get(f"{live}/{rel}") or {}).get("data"), keys)
    return Experiment(name=name, rev=str(state.get("rev")), params=params, figures=figures)


def experiments_from_json(shown: list[dict[str, Any]]) -> list[Experiment]:
    """Rows of ``dvc exp show --json``: the workspace, each baseline commit and each
    experiment run on it; rows without any figure (nothing validated) are left out."""
    rows: list[Experiment] = []
    for state in shown:
        rev = str(state.get("rev"))
        name = state.get("name") or ("workspace" if rev == "workspace" else rev[:7])
        e = _experiment(state, name)
        if e is not None:
            rows.append(e)
        for rng in state.get("experiments") or []:
            for exp in (rng.get("revs") or [])[:1]:  # the experiment's result, not its history
                e = _experiment(exp, rng.get("name") or exp.get("name") or str(exp["rev"])[:7])
                if e is not None:
                    rows.append(e)
    rows = [r for r in rows if any(v is not None for v in r.figures.values())]
    # after `dvc exp run` the workspace holds that experiment's results: one row is enough
    return [
        r
        for r in rows
        if r.rev != "workspace"
        or not any(o is not r and (o.params, o.figures) == (r.params, r.figures) for o in rows)
    ]


def changed_params(rows: list[Experiment]) -> list[str]:
    """Params whose value differs between the rows (in params.yaml order)."""
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r.params if k not in keys]
    return [
        k
        for k in keys
        if not k.startswith(IGNORED_PARAMS)
        and len({json.dumps(r.params.get(k), sort_keys=True) for r in rows}) > 1
    ]


COST_FIGURES = ("hours", "CPU-hours")  # with --x: what each experiment's draft cost


def along(rows: list[Experiment], param: str) -> list[Experiment]:
    """The rows with a numeric ``param``, sorted by it (the others were not run along it)."""
    kept = [
        r
        for r in rows
        if isinstance(r.params.get(param), (int, float))
        and not isinstance(r.params.get(param), bool)
    ]
    return sorted(kept, key=lambda r: float(r.params[param]))


def select(rows: list[Experiment], patterns: list[str]) -> list[Experiment]:
    """The rows whose name matches one of the glob ``patterns`` (all rows where none): a
    sweep's experiments without the workspace's default run or an unrelated experiment."""
    if not patterns:
        return rows
    return [r for r in rows if any(fnmatch.fnmatchcase(r.name, p) for p in patterns)]


def add_cost(rows: list[Experiment], repo: Path) -> None:
    """Each row's hours and CPU-hours to its draft, from its own stage details."""
    from eagle3_pipeline.tools.experiments.cost import read_cost

    for r in rows:
        details = r.params.get("paths.details")
        cost = read_cost(repo, r.rev, details if isinstance(details, str) else None)
        r.figures["hours"] = cost.hours
        r.figures["CPU-hours"] = cost.cpu_hours


def dvc_exp_show(cwd: Path, extra: list[str]) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "dvc", "exp", "show", "--json", *extra],
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"error: compare: dvc exp show failed in {cwd}: {tail}")
    return json.loads(proc.stdout)


def _fail(message: str) -> int:
    """One line on stderr naming the command, and the exit status of a failed comparison."""
    print(f"error: compare: {message}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="eagle3-compare",
        description="Acceptance length, vLLM speedup and val loss of every DVC experiment, "
        "with the params that differ: a table, and a PNG.",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("compare.png"),
        help="where to write the PNG (default: compare.png)",
    )
    ap.add_argument(
        "--json",
        type=Path,
        dest="from_json",
        help="read a saved `dvc exp show --json` instead of running it",
    )
    ap.add_argument("--repo", type=Path, default=Path("."), help="the DVC project (default: .)")
    ap.add_argument(
        "-A",
        "--all-commits",
        action="store_true",
        help="experiments of every commit, not only HEAD's (dvc exp show -A)",
    )
    ap.add_argument(
        "--x",
        metavar="PARAM",
        help="draw the acceptance figures against this numeric param (e.g. train.samples) "
        "and against each experiment's CPU-hours, instead of one bar per experiment",
    )
    ap.add_argument(
        "--only",
        metavar="NAME",
        action="append",
        default=[],
        help="keep only the experiments whose name matches this glob (repeatable; e.g. "
        "--only 'smollm2-*' leaves out the workspace's default run)",
    )
    args = ap.parse_args(argv)
    from eagle3_pipeline.tools.experiments.render import render_png, render_scaling, render_table

    if args.from_json:
        shown = json.loads(args.from_json.read_text(encoding="utf-8"))
    else:
        shown = dvc_exp_show(args.repo, ["-A"] if args.all_commits else [])
    rows = experiments_from_json(shown)
    if not rows:
        return _fail(
            "no experiment has validated yet (dvc repro, then dvc exp run -S train.samples=...)"
        )
    names = [r.name for r in rows]
    rows = select(rows, args.only)
    if not rows:
        return _fail(
            f"no validated experiment matches --only {' '.join(args.only)} "
            f"(validated: {', '.join(names)})"
        )
    if args.x:
        rows = along(rows, args.x)
        if not rows:
            return _fail(
                f"no validated experiment has a numeric {args.x} (run a sweep: "
                f"dvc exp run --queue -S {args.x}=64,250,1000, then dvc queue start)"
            )
        add_cost(rows, args.repo)
    params = changed_params(rows)
    # a figure no experiment has (best K without validate.k_sweep) is not a column
    wanted = [c for c, _, _ in FIGURES] + (list(COST_FIGURES) if args.x else [])
    columns = [c for c in wanted if any(r.figures.get(c) is not None for r in rows)]
    print(render_table(rows, params, columns))
    if args.x:
        render_scaling(rows, args.x, params, args.out)
    else:
        render_png(rows, params, columns, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
