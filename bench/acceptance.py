"""Benchmark of the acceptance evaluator, two ways of one measurement side by side in one
process, over the same prompts:

- ``--compare kv_cache`` (default): KV caches (``validate.kv_cache=true``) against the
  recomputing evaluator, without the lossless check;
- ``--compare lossless``: the whole evaluator with KV caches and its lossless check, the
  check done in one teacher-forced target forward per answer (today's) against decoding
  the greedy reference token by token (the older check);
- ``--compare replay``: the whole evaluator (KV caches, lossless check) against the replay
  evaluator (``validate.evaluator=replay``: the target's greedy answers generated in
  batches of ``--batch-size`` prompts, then the draft replayed over them).

For each number of new tokens (default 64 and 512) it runs both variants on the same
target, draft and prompts, interleaved over ``--trials`` trials, and prints each one's
tokens/s, the median of the paired ratios (baseline time / new time), and whether the two
produced identical tokens, counts and verdicts (they must).

Target and draft: a pipeline run's (``--workdir DIR`` holding data/target/ and data/draft/,
e.g. the repository after ``dvc repro``), or by default a random-weight Llama target built
here (hidden 256, 4 layers) with an untrained draft: every draft is then rejected and the
target's cache rolls back K positions each step, which is the evaluator's worst case.
Stop tokens are ignored so that every prompt generates exactly N tokens. Prompts: the run's
held-out prompts (``--workdir`` with data/heldout/prompts.jsonl), else 32 synthetic tokens.

Usage: python bench/acceptance.py [--compare kv_cache|lossless|replay] [--workdir DIR]
       [--tokens 64 512] [--trials 3] [--prompts 1] [--threads 1] [--batch-size 16]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def random_target(root: Path) -> Any:
    sys.path.insert(0, str(Path(__file__).parent))
    from extract import build_target  # a random-weight Llama target, as bench/extract.py

    build_target(root, hidden=256, layers=4, vocab=2048)
    return _spec(root)


def _spec(root: Path) -> Any:
    from eagle3_pipeline.targets.adapter import load_target_spec

    spec = load_target_spec(root / "data/target/target.json")
    path = Path(spec.path or "")
    return dataclasses.replace(spec, path=str(path if path.is_absolute() else root / path))


def untrained_draft(spec: Any, k: int) -> Any:
    from eagle3_pipeline.core.config import DraftShapeConfig
    from eagle3_pipeline.draft.shape import build_draft, build_vocab_mapping, resolve_draft_shape

    torch.manual_seed(0)
    freq = {i: 1 for i in range(min(spec.vocab_size, 1024))}
    d2t, t2d = build_vocab_mapping(freq, 1024, spec.vocab_size, [])
    shape = resolve_draft_shape(DraftShapeConfig(), spec)
    return build_draft(spec, shape, k, 1024, d2t, t2d, spec.path, "sdpa")


# per comparison: (baseline name, evaluator options), (new name, evaluator options); the
# options go to acceptance.measure(), or to replay.measure() where they say "replay"
VARIANTS: dict[str, tuple[tuple[str, dict[str, Any]], tuple[str, dict[str, Any]]]] = {
    "kv_cache": (
        ("recompute", {"check_lossless": False, "kv_cache": False}),
        ("kv_cache", {"check_lossless": False, "kv_cache": True}),
    ),
    "lossless": (
        ("decode_check", {"kv_cache": True, "lossless_by": "decode"}),
        ("forward_check", {"kv_cache": True, "lossless_by": "forward"}),
    ),
    "replay": (
        ("chained", {"kv_cache": True}),
        ("replay", {"replay": True}),
    ),
}


def evaluate(target: Any, draft: Any, prompts: Any, k: int, n: int, **options: Any) -> Any:
    from eagle3_pipeline.validate import replay
    from eagle3_pipeline.validate.acceptance import measure

    if options.pop("replay", False):
        return replay.measure(target, draft, prompts, k, n, [], **options)
    return measure(target, draft, prompts, k, n, [], **options)


def load_bench_prompts(workdir: Path | None, count: int) -> tuple[list[Any], str]:
    from eagle3_pipeline.validate.acceptance import Prompt, load_prompts

    heldout = workdir / "data/heldout/prompts.jsonl" if workdir else None
    if heldout is not None and heldout.is_file():
        return load_prompts(heldout)[:count], "held-out prompts"
    synthetic = [Prompt(str(i), [(7 * i + j) % 200 + 10 for j in range(32)]) for i in range(count)]
    return synthetic, "synthetic prompts of 32 tokens"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, help="a run's directory (data/target, data/draft)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=1)
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--compare", choices=sorted(VARIANTS), default="kv_cache")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--batch-size", type=int, default=16, help="replay: prompts per batch")
    ap.add_argument("--out", type=Path, help="also write the figures as JSON")
    args = ap.parse_args()
    (base_name, base), (new_name, new) = VARIANTS[args.compare]
    if args.compare == "replay":
        new = {**new, "batch_size": args.batch_size}

    from eagle3_pipeline.validate.acceptance import SpeculatorsDraft, Target

    torch.set_num_threads(args.threads)  # default one: as on a loaded machine
    tmp = tempfile.TemporaryDirectory()
    if args.workdir:
        from eagle3_pipeline.draft.checkpoint import load_trained_draft

        spec = _spec(args.workdir)
        model = load_trained_draft(
            args.workdir / "data/draft", spec.path, attn_implementation="sdpa"
        )
        source = f"{args.workdir} ({spec.name}, trained draft)"
    else:
        spec = random_target(Path(tmp.name))
        model = untrained_draft(spec, args.k)
        source = "random-weight Llama h256 x4 layers, untrained draft"
    target = Target.load(spec)
    draft = SpeculatorsDraft(model)
    prompts, kind = load_bench_prompts(args.workdir, args.prompts)
    print(
        f"target: {source}; K={args.k}; {len(prompts)} {kind}; "
        f"{args.trials} interleaved trials; torch threads {args.threads}; "
        f"{new_name} against {base_name}"
    )
    rows = []
    for n in args.tokens:
        times: dict[str, list[float]] = {base_name: [], new_name: []}
        results: dict[str, Any] = {}
        for _ in range(args.trials):
            for name, kwargs in ((base_name, base), (new_name, new)):
                t0 = time.perf_counter()
                res, per_prompt = evaluate(target, draft, prompts, args.k, n, **kwargs)
                times[name].append(time.perf_counter() - t0)
                results[name] = (res.to_dict(), [dataclasses.asdict(r) for r in per_prompt])
        tokens = results[base_name][0]["tokens"]
        ratios = [a / b for a, b in zip(times[base_name], times[new_name], strict=True)]
        row = {
            "new_tokens": n,
            "tokens": tokens,
            f"{base_name}_tokens_per_s": tokens / statistics.median(times[base_name]),
            f"{new_name}_tokens_per_s": tokens / statistics.median(times[new_name]),
            "median_paired_ratio": statistics.median(ratios),
            "identical": results[base_name] == results[new_name],
        }
        rows.append(row)
        print(
            f"{n:>5} new tokens: {base_name} {row[f'{base_name}_tokens_per_s']:8.1f} tok/s, "
            f"{new_name} {row[f'{new_name}_tokens_per_s']:8.1f} tok/s, "
            f"ratio {row['median_paired_ratio']:.2f}x, identical: {row['identical']}"
        )
    target.close()
    if args.out:
        args.out.write_text(
            json.dumps({"source": source, "compare": args.compare, "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
