"""Benchmark: does the train stage's checkpoint measure rank the epochs' drafts as vLLM
does?

From a finished work directory (prepared rows and hidden states present), the train
stage is rerun into ``--out`` with ``train.keep_epoch_drafts=true`` (and ``--set``
overrides, e.g. ``train.epochs=8``), so every epoch's draft is on disk beside the
figures the choice saw (``checkpoint.candidates`` of its ``train.json``). Each epoch's
draft is then served in vLLM (offline engine, float32, K = train.speculative_tokens,
T=0, one request at a time) on the validate stage's prompts (``validate.prompt_sets``,
MT-Bench's second turns after the target's own first answers), and the table shows, per
epoch, the held-out val loss, the val acceptance (what ``train.select=val_acceptance``
ranks by) and vLLM's acceptance length pooled and per prompt set. Below it: Kendall's
tau between each training-time measure and vLLM's pooled acceptance, which epoch each
would choose, and what the choice costs against vLLM's best epoch.

``--kept`` serves the epochs the work directory's own train stage kept instead (a run with
``train.keep_epoch_drafts=true``: its ``train.json`` and ``<train_state>/epochs/``), so a
long run's choice is measured without training it again.

Everything is written under ``--out`` (the retrained drafts, vLLM's logs,
``selection.json``); ``--resume`` keeps the epochs ``selection.json`` already holds when
the work directory and settings are unchanged.

    python bench/selection.py [--workdir .] [--out bench_out/selection]
                              [--set train.epochs=8 ... | --kept] [--max-tokens N] [--resume]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recipe import bench_prompts, serve, train_variant  # noqa: E402


def kendall_tau(xs: list[float], ys: list[float]) -> float | None:
    """Kendall's tau-a: (concordant - discordant pairs) / all pairs; None under 2 points."""
    pairs = list(itertools.combinations(range(len(xs)), 2))
    if not pairs:
        return None
    score = 0
    for i, j in pairs:
        a, b = xs[i] - xs[j], ys[i] - ys[j]
        score += (a * b > 0) - (a * b < 0)
    return score / len(pairs)


def _argmax(xs: list[float]) -> int:
    return max(range(len(xs)), key=lambda i: (xs[i], -i))  # the earliest of equals


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workdir", type=Path, default=Path("."))
    ap.add_argument("--out", type=Path, default=Path("bench_out/selection"))
    ap.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a train key for the rerun (repeatable), e.g. train.epochs=8",
    )
    ap.add_argument(
        "--max-tokens", type=int, default=None, help="per prompt (validate.max_new_tokens)"
    )
    ap.add_argument("--resume", action="store_true", help="keep the epochs already served")
    ap.add_argument(
        "--kept",
        action="store_true",
        help="serve the epochs the work directory's train stage kept "
        "(train.keep_epoch_drafts=true) instead of training again",
    )
    args = ap.parse_args()
    if args.kept and args.sets:
        ap.error("--kept serves the run as it was trained: no --set")

    from eagle3_pipeline.core.config import load_params
    from eagle3_pipeline.targets.adapter import load_target_spec
    from eagle3_pipeline.train.record import TrainRecord
    from eagle3_pipeline.train.state import EPOCH_DRAFTS

    work = args.workdir.resolve()
    out = args.out if args.out.is_absolute() else work / args.out
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_params(work / "params.yaml")
    spec = load_target_spec(work / cfg.paths.target / "target.json")
    key = {
        "workdir": str(work),
        "sets": args.sets,
        "max_tokens": args.max_tokens,
        "kept": args.kept,
    }
    path = out / "selection.json"
    results: dict[str, Any] = {"key": key, "epochs": {}}
    if args.resume and path.is_file():
        old = json.loads(path.read_text())
        if old.get("key") == key:
            results = old
            print(f"resuming: epochs {', '.join(results['epochs']) or 'none'} served", flush=True)

    if args.kept:
        details = work / cfg.paths.details / "train.json"
        epochs = work / cfg.paths.train_state / EPOCH_DRAFTS
        if not epochs.is_dir():
            raise SystemExit(
                f"error: {epochs}: no kept epochs (train with -S train.keep_epoch_drafts=true)"
            )
    else:
        details = out / "train" / "details" / "train.json"
        epochs = out / "train" / "state" / EPOCH_DRAFTS
        if not (results["epochs"] and details.is_file()):
            train_variant(work, out / "train", ["train.keep_epoch_drafts=true", *args.sets])
    record = TrainRecord.read(details)
    if record.checkpoint is None:
        raise SystemExit(f"error: {details}: no checkpoint choice recorded")
    prompts = bench_prompts(cfg, spec, work, out)
    sets = list(dict.fromkeys(p.set for p in prompts))
    for cand in record.checkpoint.candidates:
        name = str(cand.epoch)
        if name in results["epochs"]:
            continue
        draft = epochs / f"epoch_{cand.epoch:03d}"
        print(f"epoch {cand.epoch}: serving {draft} in vLLM", flush=True)
        served = serve(
            cfg, spec, work, draft, f"selection_e{cand.epoch}", prompts, "float32", args.max_tokens
        )
        results["epochs"][name] = {**cand.__dict__, **served}
        path.write_text(json.dumps(results, indent=2) + "\n")
        print(f"  vLLM acceptance {served['acceptance_length']:.3f}", flush=True)

    rows = [results["epochs"][str(c.epoch)] for c in record.checkpoint.candidates]
    max_tokens = args.max_tokens or cfg.validate.max_new_tokens
    print(
        f"\n{len(prompts)} prompts ({', '.join(sets)}), at most {max_tokens} new tokens each, "
        f"K={cfg.train.speculative_tokens}, T=0, one request, float32 vLLM\n"
    )
    print(f"| epoch | step | val loss | val acceptance | vLLM pooled | {' | '.join(sets)} |")
    print("|---:|---:|---:|---:|---:|" + "---:|" * len(sets))
    for r in rows:
        by = " | ".join(f"{r['by_set'].get(s, 0):.3f}" for s in sets)
        print(
            f"| {r['epoch']} | {r['step']} | {r['val_loss']:.4f} | {r['val_acceptance']:.4f} "
            f"| {r['acceptance_length']:.3f} | {by} |"
        )
    vllm = [r["acceptance_length"] for r in rows]
    best = _argmax(vllm)
    print()
    measures = {
        "val_acceptance": [r["val_acceptance"] for r in rows],
        "val_loss (lower is better)": [-r["val_loss"] for r in rows],
        "last epoch": [float(i) for i in range(len(rows))],
    }
    summary = {}
    for name, xs in measures.items():
        chosen = _argmax(xs)
        tau = kendall_tau(xs, vllm)
        summary[name] = {"tau": tau, "chosen_epoch": rows[chosen]["epoch"]}
        print(
            f"- {name}: Kendall tau with vLLM {'-' if tau is None else f'{tau:+.2f}'}; chooses "
            f"epoch {rows[chosen]['epoch']} (vLLM {vllm[chosen]:.3f}; vLLM's best: epoch "
            f"{rows[best]['epoch']}, {vllm[best]:.3f})"
        )
    results["summary"] = summary
    path.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
