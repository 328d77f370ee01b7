"""Benchmark: the pipeline's draft recipe against speculators' stock recipe, in vLLM.

On one finished working directory (after ``dvc repro`` or ``dvc exp run``: its target,
prepared rows, hidden states, held-out prompts and trained draft), with the same draft
vocabulary (the draft's own ``d2t``), epochs, TTT steps and seed:

- ``stock (its defaults)``: speculators' own CLI, ``python -m speculators.train``, with its
  0.9 defaults (Muon, lr 1e-3, linear schedule, KL loss, ``norm_before_fc`` and
  ``norm_output``, 8192 tokens per step), changing only what a CPU forces:
  ``--draft-attn-impl sdpa`` (flex attention has no CPU backward),
  ``--loss-implementation eager`` (the fused loss is Triton), ``--num-workers 1`` (2
  cores), the trainer on ``cpu`` (compat/speculators.py ``stock_cli_main``). On a GPU
  host only the data flags are passed.
- ``stock (our tokens per step)``: the same with ``--total-seq-len`` = ``train.tokens_per_step``,
  so it takes as many optimizer steps as the pipeline;
- ``pipeline``: the working directory's own ``data/draft``;
- any ``--variant NAME key=value,...``: the pipeline's train stage rerun with those keys
  changed (same data), written under the output directory.

Every draft is served by vLLM (offline ``vllm.LLM`` with the draft, K =
``train.speculative_tokens``, float32, temperature 0, one request at a time) on the
validate stage's prompts: ``validate.prompt_sets`` (e.g. mt_bench and humaneval, seeded
subsets of ``validate.num_prompts``; MT-Bench's second turn after the target's own first
answer) and ``validate.max_new_tokens``; the figures are vLLM's own spec-decode counters,
read per prompt set. Printed: acceptance length pooled and per set, optimizer steps, train
wall time, and the ratio of each figure to the stronger stock run's.

    python bench/recipe.py [--workdir .] [--out bench_out/recipe] [--skip-stock-defaults]
                           [--set validate.num_prompts=24 ...] [--resume]
                           [--variant muon train.optimizer=muon ...]

``--resume`` keeps what ``recipe.json`` already holds (a stock run takes the longest), so
adding a variant costs only that variant.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml


def _stock_flags(cfg: Any, spec: Any, work: Path, vocab_dir: Path, out: Path) -> list[str]:
    import torch

    t = cfg.train  # (epochs: the run's, or --epochs)
    flags = [
        "--verifier-name-or-path",
        str((work / spec.path).resolve()),
        "--data-path",
        str((work / cfg.paths.prepared).resolve()),
        "--hidden-states-path",
        str((work / cfg.paths.hidden_states).resolve()),
        "--target-layer-ids",
        *map(str, spec.aux_layer_ids),
        "--draft-vocab-size",
        str(t.draft_vocab_size),
        "--d2t-path",
        str(vocab_dir / "d2t.npy"),
        "--t2d-path",
        str(vocab_dir / "t2d.npy"),
        "--epochs",
        str(t.epochs),
        "--ttt-steps",
        str(t.speculative_tokens),
        "--seed",
        str(cfg.seed),
        "--train-data-ratio",
        str(1 - t.val_fraction),
        "--on-missing",
        "raise",
        "--no-resume-from-checkpoint",
        "--save-path",
        str(out),
    ]
    if not torch.cuda.is_available():
        flags += [
            "--draft-attn-impl",
            "sdpa",
            "--loss-implementation",
            "eager",
            "--num-workers",
            "1",
        ]
    return flags


def _vocab_files(draft_dir: Path, target_vocab: int, out: Path) -> None:
    """The pipeline draft's own vocabulary (``d2t`` offsets) as the CLI's npy files."""
    import numpy as np
    from safetensors.torch import load_file

    d2t = load_file(str(draft_dir / "model.safetensors"))["d2t"].long().numpy()
    t2d = np.zeros(target_vocab, dtype=bool)
    t2d[np.arange(len(d2t)) + d2t] = True
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "d2t.npy", d2t)
    np.save(out / "t2d.npy", t2d)


def _final_checkpoint(save_path: Path) -> Path:
    epochs = sorted(
        (
            p
            for p in save_path.iterdir()
            if p.is_dir() and p.name.isdigit() and (p / "config.json").is_file()
        ),
        key=lambda p: int(p.name),
    )
    if not epochs:
        raise SystemExit(f"error: recipe: {save_path} holds no epoch checkpoint")
    return epochs[-1]


def _steps_from_log(text: str) -> int | None:
    import re

    found = re.findall(r"global_step[\"']?\s*[:=]\s*(\d+)", text)
    return int(found[-1]) if found else None


def train_stock(cfg: Any, spec: Any, work: Path, out: Path, extra: list[str]) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "eagle3_pipeline.tools.speculators_cli",
        *_stock_flags(cfg, spec, work, out.parent / "vocab", out / "ckpt"),
        *extra,
    ]
    print("+", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    with open(out / "train.log", "w") as log:
        proc = subprocess.run(cmd, cwd=work, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(
            f"error: recipe: the stock run failed ({proc.returncode}); see {out / 'train.log'}"
        )
    return {
        "draft": _final_checkpoint(out / "ckpt"),
        "train_s": wall,
        "steps": _steps_from_log((out / "train.log").read_text(errors="replace")),
    }


def _apply_sets(params: dict[str, Any], sets: list[str]) -> None:
    """Set each dotted ``key=value`` (YAML value) in the params snapshot ``params``."""
    for item in sets:
        key, value = item.split("=", 1)
        node = params
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = yaml.safe_load(value)


def measured_params(work: Path, out: Path, sets: list[str]) -> Path:
    """The work directory's params snapshot, with the measurement's ``validate.*`` keys
    in ``sets`` changed (e.g. fewer prompts than the work directory's own validation
    served), written to ``OUT/params.yaml``; the work directory's own when ``sets`` is
    empty. Drafts are still trained with the work directory's ``train`` keys."""
    if not sets:
        return work / "params.yaml"
    params = yaml.safe_load((work / "params.yaml").read_text())
    _apply_sets(params, sets)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def train_variant(work: Path, out: Path, sets: list[str]) -> dict[str, Any]:
    """The pipeline's train stage on the same data with ``sets`` changed, into ``out``."""
    params = yaml.safe_load((work / "params.yaml").read_text())
    sets = [
        *sets,
        f"paths.draft={out / 'draft'}",
        f"paths.train_state={out / 'state'}",
        f"paths.live={out / 'live'}",
        f"paths.details={out / 'details'}",
    ]
    _apply_sets(params, sets)
    out.mkdir(parents=True, exist_ok=True)
    (out / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    cmd = [
        sys.executable,
        "-m",
        "eagle3_pipeline.stages.train",
        "--params",
        str(out / "params.yaml"),
    ]
    print("+", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    with open(out / "train.log", "w") as log:
        proc = subprocess.run(cmd, cwd=work, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"error: recipe: variant failed; see {out / 'train.log'}")
    from eagle3_pipeline.train.record import TrainRecord

    details = TrainRecord.read(out / "details" / "train.json")
    return {"draft": out / "draft", "train_s": time.perf_counter() - t0, "steps": details.steps}


def bench_prompts(cfg: Any, spec: Any, work: Path, out: Path) -> list[Any]:
    """The validate stage's prompts: ``validate.prompt_sets`` (seeded subsets of
    ``validate.num_prompts``), MT-Bench's second turns asked after the target's own first
    answers (vLLM's greedy output of the target alone, computed once and kept in
    ``OUT/prompts.json``, so every draft is measured on the same prompts)."""
    import os

    from eagle3_pipeline.serving.engine import build_engine, log_file
    from eagle3_pipeline.serving.env import find_python
    from eagle3_pipeline.serving.offline import run_offline
    from eagle3_pipeline.validate.prompt_sets import EvalPrompt, load_first_turns, second_turns
    from eagle3_pipeline.validate.run import load_tokenizer, stop_token_ids

    v = cfg.validate
    names = [str(getattr(x, "value", x)) for x in v.prompt_sets]
    key = [names, v.num_prompts, v.max_new_tokens, cfg.seed]
    cached = out / "prompts.json"
    if cached.is_file():
        saved = json.loads(cached.read_text())
        if saved["key"] == key:
            return [EvalPrompt(**p) for p in saved["prompts"]]
    old = os.getcwd()
    os.chdir(work)
    try:
        tokenizer = load_tokenizer(spec)
        prompts = load_first_turns(
            names,
            Path(cfg.paths.heldout) / "prompts.jsonl",
            tokenizer,
            v.num_prompts,
            cfg.seed,
            spec.vocab_size,
        )
        stops = stop_token_ids(spec.path)
        pending = [p for p in prompts if p.next_questions]
        while pending:
            run = run_offline(
                find_python(cfg.vllm.python),
                build_engine(cfg, spec, spec.path, "baseline", dtype="float32"),
                [p.prompt_ids for p in pending],
                v.max_new_tokens,
                stops,
                log_file(cfg, "recipe_turns"),
                timeout_s=cfg.vllm.startup_timeout_s + 3600,
            )
            nxt = second_turns(pending, run.outputs, tokenizer, set(stops))
            prompts += nxt
            pending = [p for p in nxt if p.next_questions]
    finally:
        os.chdir(old)
    cached.write_text(json.dumps({"key": key, "prompts": [dataclasses.asdict(p) for p in prompts]}))
    return prompts


def serve(
    cfg: Any,
    spec: Any,
    work: Path,
    draft: Path,
    name: str,
    prompts: list[Any],
    dtype: str = "float32",
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """vLLM's counters for ``draft`` on ``prompts`` (offline engine, ``dtype``, T=0, one
    request at a time, ``max_tokens`` or ``validate.max_new_tokens`` each), pooled and
    per prompt set."""
    import os

    from eagle3_pipeline.serving.engine import build_engine, log_file
    from eagle3_pipeline.serving.env import find_python
    from eagle3_pipeline.serving.offline import run_offline
    from eagle3_pipeline.validate.by_set import vllm_by_set
    from eagle3_pipeline.validate.run import stop_token_ids
    from eagle3_pipeline.validate.vllm import acceptance_figures

    old = os.getcwd()
    os.chdir(work)
    try:
        k = cfg.train.speculative_tokens
        engine = build_engine(
            cfg, spec, spec.path, "validate", dtype=dtype, draft_dir=draft.resolve(), k=k
        )
        run = run_offline(
            find_python(cfg.vllm.python),
            engine,
            [p.prompt_ids for p in prompts],
            cfg.validate.max_new_tokens if max_tokens is None else max_tokens,
            stop_token_ids(spec.path),
            log_file(cfg, f"recipe_{name}"),
            timeout_s=cfg.vllm.startup_timeout_s + 3600,
            labels=[p.group for p in prompts],
        )
    finally:
        os.chdir(old)
    fig = acceptance_figures(run.counters)
    return {
        "acceptance_length": fig.mean_acceptance_length,
        "per_position_rate": fig.per_position_rate,
        "by_set": {
            n: f.mean_acceptance_length for n, f in vllm_by_set(prompts, run.group_counters).items()
        },
        "tokens_per_s": run.tokens_per_s,
        "generated_tokens": run.generated_tokens,
    }


def _fmt(v: Any, nd: int = 3) -> str:
    return "-" if v is None else f"{v:.{nd}f}" if isinstance(v, float) else str(v)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workdir", type=Path, default=Path("."))
    ap.add_argument("--out", type=Path, default=Path("bench_out/recipe"))
    ap.add_argument(
        "--skip-stock-defaults",
        action="store_true",
        help="skip the stock run at its own 8192 tokens per step",
    )
    ap.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="train every draft for this many epochs (a quick check of the bench; "
        "the pipeline's draft is then retrained too)",
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep the runs already in OUT/recipe.json (same work directory and "
        "epochs) and train only the missing ones",
    )
    ap.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="validate.KEY=VALUE",
        help="measure with this validate key changed (repeatable), e.g. "
        "validate.num_prompts=24 on a work directory validated on every prompt",
    )
    ap.add_argument(
        "--variant",
        nargs="+",
        action="append",
        default=[],
        metavar=("NAME", "KEY=VALUE"),
        help="also train the pipeline's recipe with these keys changed",
    )
    args = ap.parse_args()
    bad = [s for s in args.sets if "=" not in s or not s.startswith("validate.")]
    if bad:
        ap.error(f"--set takes validate.KEY=VALUE (train keys go in --variant): {bad[0]}")

    from eagle3_pipeline.core.config import load_params
    from eagle3_pipeline.targets.adapter import load_target_spec
    from eagle3_pipeline.train.record import TrainRecord

    work = args.workdir.resolve()
    out = args.out if args.out.is_absolute() else work / args.out
    cfg = load_params(measured_params(work, out, args.sets))
    if args.epochs is not None:
        cfg.train.epochs = args.epochs
    spec = load_target_spec(work / cfg.paths.target / "target.json")
    _vocab_files(work / cfg.paths.draft, spec.vocab_size, out / "vocab")
    pipeline_train = TrainRecord.read(work / cfg.paths.details / "train.json")

    runs: dict[str, dict[str, Any]] = {}
    out.mkdir(parents=True, exist_ok=True)
    prompts = bench_prompts(cfg, spec, work, out)
    sets = list(dict.fromkeys(p.set for p in prompts))
    if args.resume and (out / "recipe.json").is_file():
        runs = json.loads((out / "recipe.json").read_text())
        print(f"resuming: {', '.join(runs)} already measured", flush=True)

    def done(name: str, run: Any) -> None:
        """Serve the draft just trained; keep every figure so far in recipe.json.
        ``run``: the run, or a function that trains it (not called when resumed)."""
        if name in runs:
            return
        if callable(run):
            run = run()
        print(f"serving {name} ({run['draft']}) in vLLM", flush=True)
        run.update(serve(cfg, spec, work, Path(run["draft"]), name.split()[0], prompts))
        per_set = ", ".join(f"{n} {_fmt(x)}" for n, x in run["by_set"].items())
        print(
            f"  {name}: acceptance length {_fmt(run['acceptance_length'])} ({per_set})",
            flush=True,
        )
        runs[name] = run
        (out / "recipe.json").write_text(
            json.dumps({n: {**r, "draft": str(r["draft"])} for n, r in runs.items()}, indent=2)
        )

    epochs = [f"train.epochs={args.epochs}"] if args.epochs is not None else []
    if epochs:  # the pipeline's own draft was trained for other epochs: train it again
        done("pipeline", lambda: train_variant(work, out / "pipeline", epochs))
    else:
        done(
            "pipeline",
            {
                "draft": work / cfg.paths.draft,
                "steps": pipeline_train.steps,
                "train_s": pipeline_train.wall_s,
            },
        )
    done(
        "stock (our tokens/step)",
        lambda: train_stock(
            cfg,
            spec,
            work,
            out / "stock_our_tokens",
            ["--total-seq-len", str(cfg.train.tokens_per_step)],
        ),
    )
    for name, *overrides in args.variant:  # not ``sets``: the prompt sets' names below
        done(
            f"pipeline {name}",
            lambda n=name, o=overrides: train_variant(work, out / f"variant_{n}", [*epochs, *o]),
        )
    if not args.skip_stock_defaults:
        done(
            "stock (its defaults)", lambda: train_stock(cfg, spec, work, out / "stock_defaults", [])
        )

    def ratio_base(key: str | None) -> float | None:
        """The stronger stock run's figure (pooled, or one set's)."""
        vals = [
            (r["acceptance_length"] if key is None else (r.get("by_set") or {}).get(key))
            for n, r in runs.items()
            if n.startswith("stock")
        ]
        present = [float(x) for x in vals if x]
        return max(present) if present else None

    cols = [None, *sets]
    bases = {c: ratio_base(c) for c in cols}
    print(
        f"\nK={cfg.train.speculative_tokens}, {cfg.train.epochs} epochs, draft vocab "
        f"{cfg.train.draft_vocab_size}, seed {cfg.seed}; vLLM's counters (1 + accepted/drafts, "
        f"T=0, one request at a time) on {len(prompts)} prompts of "
        f"{', '.join(sets)} ({cfg.validate.num_prompts or 'all'} per set, MT-Bench's two "
        f"turns) x {cfg.validate.max_new_tokens} tokens; ratio: / the stronger stock run"
    )
    head = "".join(f" {(c or 'pooled'):>16}" for c in cols)
    print(f"{'draft':28} {'steps':>6}{head}  train s")
    for name, r in runs.items():
        cells = []
        for c in cols:
            x = r["acceptance_length"] if c is None else (r.get("by_set") or {}).get(c)
            ratio = x / bases[c] if x and bases[c] else None
            cells.append(f" {_fmt(x):>7} ({_fmt(ratio, 2):>5}x)")
        print(f"{name:28} {_fmt(r['steps']):>6}{''.join(cells)}  {_fmt(r['train_s'], 0)}")
    print(f"wrote {out / 'recipe.json'}")


if __name__ == "__main__":
    main()
