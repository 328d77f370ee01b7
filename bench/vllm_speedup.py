"""Benchmark: vLLM's single-stream tokens/s with and without the draft, side by side, and
what the CPU build's workarounds cost.

Engines, each built by the pipeline's one engine builder and run by its vLLM worker on the
same held-out prompts (greedy, one prompt at a time, after a warm-up request):

- ``target``: the target alone, as a user serves it (MLA on): the baseline;
- ``target + draft``: EAGLE-3 at K (on the CPU build with MLA off, workaround 1);
- ``target, MLA off``: the target alone with workaround 1: its cost without a draft;
- ``target, rotary op off``: the target alone with workaround 2 forced on.

Rounds are interleaved (every engine once per round) so load from other processes hits
all alike; each figure is the median over rounds, and ratios are to the baseline of the
same round (median of the paired ratios).

Run from a working directory that holds data/target, data/draft and data/heldout
(after ``dvc repro``):

    python bench/vllm_speedup.py [--rounds 2] [--prompts 16] [--max-tokens 64]
        [--dtype bfloat16] [--draft-only] [--prompt-set mt_bench --prompt-set humaneval]

``--dtype bfloat16`` times the engines as a user serves the target on a CPU with native
bf16 (the validate stage's speed figures are one pass, not interleaved rounds);
``--draft-only`` keeps the first two engines, for a target without MLA;
``--prompt-set mt_bench --prompt-set humaneval`` times validate's prompt sets (first turns, the
seeded subsets validate picks, ``--prompts`` per set) instead of the held-out
conversations.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the engines' precision: float32 (exact, the proof's) or bfloat16 (as a user "
        "serves the target on a CPU with native bf16)",
    )
    parser.add_argument(
        "--draft-only",
        action="store_true",
        help="time only the target and target + draft (skip the MLA and rotary workaround "
        "engines, which matter only for MLA targets on the CPU build)",
    )
    parser.add_argument(
        "--prompt-set",
        dest="prompt_sets",
        action="append",
        choices=("heldout", "mt_bench", "humaneval"),
        default=None,
        help="where the prompts come from (repeatable): heldout (the first --prompts "
        "held-out conversations, the default) or validate's prompt sets (mt_bench, "
        "humaneval: first turns, a seeded stratified subset of --prompts each, as "
        "validate picks them)",
    )
    parser.add_argument("overrides", nargs="*", help="config key=value")
    args = parser.parse_args()
    args.prompt_sets = args.prompt_sets or ["heldout"]

    from eagle3_pipeline.core.config import load_config
    from eagle3_pipeline.serving.engine import CompilationConfig, build_engine
    from eagle3_pipeline.serving.env import find_python
    from eagle3_pipeline.serving.offline import run_offline
    from eagle3_pipeline.targets.adapter import load_target_spec
    from eagle3_pipeline.validate.acceptance import load_prompts
    from eagle3_pipeline.validate.prompt_sets import load_first_turns
    from eagle3_pipeline.validate.run import load_tokenizer, stop_token_ids

    cfg = load_config(args.overrides)
    data = Path(cfg.data_dir)
    spec = load_target_spec(data / "target" / "target.json")
    draft = data / "draft"
    draft_cfg = json.loads((draft / "config.json").read_text(encoding="utf-8"))
    k = (
        cfg.validate.k
        or draft_cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    )
    if args.prompt_sets == ["heldout"]:
        prompts = [p.prompt_ids for p in load_prompts(data / "heldout" / "prompts.jsonl")]
        prompts = prompts[: args.prompts]
    else:
        first = load_first_turns(
            args.prompt_sets,
            data / "heldout" / "prompts.jsonl",
            load_tokenizer(spec),
            args.prompts,
            cfg.seed,
            spec.vocab_size,
        )
        prompts = [p.prompt_ids for p in first]
    model = spec.path or ""
    stops = stop_token_ids(model)
    python = find_python(cfg.vllm.python)

    base = build_engine(cfg, spec, model, "baseline", dtype=args.dtype)
    engines = {
        "target": base,
        "target + draft": build_engine(
            cfg, spec, model, "validate", dtype=args.dtype, draft_dir=draft, k=k
        ),
    }
    if not args.draft_only:
        engines["target, MLA off"] = dataclasses.replace(
            base, env={**base.env, "VLLM_MLA_DISABLE": "1"}
        )
        engines["target, rotary op off"] = dataclasses.replace(
            base, compilation_config=CompilationConfig(["-rotary_embedding"])
        )
    tps: dict[str, list[float]] = {name: [] for name in engines}
    ratio: dict[str, list[float]] = {name: [] for name in engines}
    loads: dict[str, list[float]] = {name: [] for name in engines}
    outputs: dict[str, list[list[int]]] = {}
    for r in range(args.rounds):
        round_tps = {}
        for name, eng in engines.items():
            res = run_offline(
                python,
                eng,
                prompts,
                args.max_tokens,
                stops,
                Path(cfg.vllm.log_dir) / "bench_vllm_speedup.log",
            )
            round_tps[name] = res.tokens_per_s or 0.0
            loads[name].append(res.load_s or 0.0)
            outputs[name] = res.outputs
            print(
                f"round {r + 1}: {name:<24} {res.tokens_per_s:8.1f} tokens/s "
                f"(engine ready in {res.load_s:.0f} s)",
                flush=True,
            )
        for name in engines:
            tps[name].append(round_tps[name])
            ratio[name].append(round_tps[name] / round_tps["target"])

    print(
        f"\n{len(prompts)} prompts ({', '.join(args.prompt_sets)}), at most {args.max_tokens} tokens each, K={k}, "
        f"{args.dtype}, {args.rounds} round(s), single stream"
    )
    print(
        f"{'engine':<24} {'tokens/s':>10} {'vs target':>10} {'ready (s)':>10} {'same output':>12}"
    )
    for name in engines:
        same = outputs[name] == outputs["target"]
        print(
            f"{name:<24} {statistics.median(tps[name]):>10.1f} "
            f"{statistics.median(ratio[name]):>9.2f}x {statistics.median(loads[name]):>10.1f} "
            f"{str(same):>12}"
        )


if __name__ == "__main__":
    main()
