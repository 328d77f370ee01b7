"""Benchmark: float32 against bf16, stage by stage, on one finished work directory.

Why: preflight picks the precision from the CPU (README, "Precision: chosen by the CPU";
``runtime/precision.py``): a real target computes in bf16 on a CPU with native bf16 (AMX,
AVX512-BF16) and in float32 elsewhere. This bench measures what that choice buys on the
machine it runs on, per stage, and what it costs in acceptance.

From a finished real-target work directory (``dvc repro`` / ``dvc exp run``: data/target,
data/prepared, data/hidden_states, data/heldout, data/draft), in one run, each stage in
float32 and in bf16 with ``--rounds`` rounds interleaved (float32, bf16, then bf16,
float32, ...) so that load from other processes hits both alike; each figure is the
median over rounds, the ratio is bf16's median over float32's:

1. regeneration: the target in vLLM (the regeneration engine of ``build_engine``)
   generating answers to the prompts of the first ``--rows`` prepared rows (each row's
   tokens before its first supervised token), greedy, ``--max-tokens`` or
   ``data.max_new_tokens`` each: output tokens/s one request at a time, and with
   ``data.server.concurrency`` requests in flight (the offline worker's engine loop);
2. extraction: the ``hf`` backend (``extract_hf``, the stage's own function, with
   ``model.dtype`` set each way) over the same rows into a temporary directory: the
   stage's tokens/s (row tokens over its forward + capture + write loop, model load
   excluded; files stored in ``extract.dtype`` both ways);
3. training: ``bench/train.py``'s ``measure`` (our train step and speculators' Trainer on
   the same packed batches, ``train.tokens_per_step`` of the work dir,
   ``--train-steps`` optimizer steps per trial, one trial per round, after a warm-up
   step): training tokens/s;
4. vLLM decoding of the validate stage's prompts (``bench/recipe.py``'s ``bench_prompts``:
   ``validate.prompt_sets``, MT-Bench's second turns included), the first ``--prompts`` of
   them taken round-robin over the sets, ``--max-tokens`` or ``validate.max_new_tokens``
   each, greedy, one request at a time: output tokens/s of the target alone and of the
   target with the work dir's draft (K = ``train.speculative_tokens``), and the speedup
   (paired per round).

Then the acceptance (``--skip-acceptance`` skips it; it dominates the time): the work
dir's train stage rerun on the same rows with ``train.dtype=float32`` and with
``train.dtype=bfloat16`` (``bench/recipe.py``'s ``train_variant``), each draft served in
vLLM in float32 (the validate stage's proof precision on a CPU, so only the training
precision differs; ``bench/recipe.py``'s ``serve``) on the same prompts: vLLM's mean
acceptance length (1 + accepted / drafts) pooled and per prompt set, K, T=0.

Everything is written under ``--out`` (vLLM's logs, the variants' drafts, and
``precision.json`` with every figure, rewritten after each part); nothing else in the
work directory changes. ``--resume`` keeps the parts ``precision.json`` already holds
(same work directory and sizes).

    python bench/precision.py [--workdir .] [--out bench_out/precision] [--rounds 2]
                              [--rows 32] [--train-steps 8] [--prompts N] [--max-tokens N]
                              [--prompt-sets mt_bench humaneval] [--skip-acceptance]
                              [--resume]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recipe import bench_prompts, serve, train_variant  # noqa: E402
from train import load_workdir_config, measure  # noqa: E402

DTYPES = ("float32", "bfloat16")


def _order(r: int) -> tuple[str, ...]:
    """Round r's order: float32 first in even rounds, bf16 first in odd ones."""
    return DTYPES if r % 2 == 0 else DTYPES[::-1]


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _fmt(v: float | None) -> str:
    """A tokens/s figure as a whole number, a ratio or an acceptance length to 3 places."""
    return "-" if v is None else f"{v:.3f}" if v < 10 else f"{v:,.0f}"


class Bench:
    """The work directory, its config and target, and the figures so far."""

    def __init__(self, args: argparse.Namespace) -> None:
        from eagle3_pipeline.serving.env import find_python
        from eagle3_pipeline.targets.adapter import load_target_spec
        from eagle3_pipeline.validate.run import stop_token_ids

        self.args = args
        self.work = args.workdir.resolve()
        self.out = args.out if args.out.is_absolute() else self.work / args.out
        self.out.mkdir(parents=True, exist_ok=True)
        os.chdir(self.work)  # the params' paths are relative to the work directory
        self.cfg = load_workdir_config(self.work, [])
        self.cfg.vllm.log_dir = str(self.out / "logs")  # never the work dir's logs/
        if args.prompt_sets:
            self.cfg.validate.prompt_sets = list(args.prompt_sets)
        self.spec = load_target_spec(Path(self.cfg.paths.target) / "target.json")
        self.python = find_python(self.cfg.vllm.python)
        self.stops = stop_token_ids(str(self.spec.path))
        self.timeout = self.cfg.vllm.startup_timeout_s + 3600
        sets = [str(getattr(s, "value", s)) for s in self.cfg.validate.prompt_sets]
        # what each part's figures depend on: --resume keeps a part whose key is unchanged
        prompts = {"prompts": args.prompts, "max_tokens": args.max_tokens, "prompt_sets": sets}
        self.key = {
            "workdir": str(self.work),
            "stages": {"rounds": args.rounds, "rows": args.rows, "train_steps": args.train_steps}
            | prompts,
            "acceptance": prompts,
        }
        self.results: dict[str, Any] = {"key": self.key, "stages": {}, "acceptance": {}}
        path = self.out / "precision.json"
        if args.resume and path.is_file():
            old = json.loads(path.read_text())
            okey = old.get("key", {})
            for part in ("stages", "acceptance"):
                same = okey.get("workdir") == self.key["workdir"]
                if same and okey.get(part) == self.key[part]:
                    self.results[part] = old.get(part, {})
                    if part == "acceptance" and "acceptance_what" in old:
                        self.results["acceptance_what"] = old["acceptance_what"]
            kept = [*self.results["stages"], *self.results["acceptance"]]
            print(f"resuming: kept {', '.join(kept) or 'nothing (other settings)'}", flush=True)
        self._rows: Path | None = None

    def save(self) -> None:
        (self.out / "precision.json").write_text(json.dumps(self.results, indent=2) + "\n")

    # ------------------------------------------------------------------ the inputs

    def rows_dir(self) -> Path:
        """The first ``--rows`` prepared rows, as a prepared dataset of their own."""
        from datasets import load_from_disk

        if self._rows is None:  # written afresh by each run (the rows may have changed)
            self._rows = self.out / "rows"
            shutil.rmtree(self._rows, ignore_errors=True)
            ds = load_from_disk(self.cfg.paths.prepared)
            ds.select(range(min(self.args.rows, len(ds)))).save_to_disk(str(self._rows))
        return self._rows

    def row_prompts(self) -> list[list[int]]:
        """Each row's tokens before its first supervised token: the prompt its first
        answer was generated after."""
        from datasets import load_from_disk

        ds = load_from_disk(str(self.rows_dir()))
        prompts = []
        for ids, mask in zip(ds["input_ids"], ds["loss_mask"], strict=True):
            first = next((i for i, m in enumerate(mask) if int(m)), len(ids))
            prompts.append([int(t) for t in ids[: max(first, 1)]])
        return prompts

    def validate_prompts(self) -> list[Any]:
        """The validate stage's prompts, the first ``--prompts`` round-robin over sets."""
        prompts = bench_prompts(self.cfg, self.spec, self.work, self.out)
        n = self.args.prompts
        if n is None or n >= len(prompts):
            return prompts
        by_set: dict[str, list[Any]] = {}
        for p in prompts:
            by_set.setdefault(p.set, []).append(p)
        mixed = [p for group in itertools.zip_longest(*by_set.values()) for p in group if p]
        return mixed[:n]

    # ------------------------------------------------------------------ the stages

    def finished(self, name: str) -> bool:
        """A stage measured without a failure (kept by --resume; a failed one reruns)."""
        st = self.results["stages"].get(name)
        return st is not None and not st["errors"]

    def stage(
        self, name: str, what: str, rounds: int, fn: Callable[[str], dict[str, float]]
    ) -> None:
        """``fn(dtype)`` -> {figure: tokens/s} once per dtype and round, interleaved;
        kept in ``results["stages"][name]``, saved after each call."""
        if self.finished(name):
            return
        figures: dict[str, dict[str, list[float]]] = {}
        errors: dict[str, str] = {}
        print(f"\n{name}: {what}", flush=True)
        for r in range(rounds):
            for dtype in _order(r):
                if dtype in errors:
                    continue
                try:
                    got = fn(dtype)
                except Exception as exc:  # one failed cell; the others still run
                    errors[dtype] = f"{type(exc).__name__}: {exc}"
                    print(f"  round {r + 1} {dtype}: failed: {errors[dtype]}", flush=True)
                    continue
                for fig, v in got.items():
                    figures.setdefault(fig, {d: [] for d in DTYPES})[dtype].append(v)
                shown = ", ".join(f"{k} {_fmt(v)}" for k, v in got.items())
                print(f"  round {r + 1} {dtype}: {shown}", flush=True)
        self.results["stages"][name] = {"what": what, "figures": figures, "errors": errors}
        self.save()

    def regeneration(self) -> None:
        from eagle3_pipeline.serving.engine import build_engine, log_file
        from eagle3_pipeline.serving.offline import Pass, run_offline

        prompts = self.row_prompts()
        c = self.cfg.data.server.concurrency
        max_tokens = self.args.max_tokens or self.cfg.data.max_new_tokens

        def run(dtype: str) -> dict[str, float]:
            engine = build_engine(
                self.cfg, self.spec, str(self.spec.path), "regenerate", dtype=dtype
            )
            res = run_offline(
                self.python,
                engine,
                prompts,
                max_tokens,
                self.stops,
                log_file(self.cfg, "bench_precision_regenerate"),
                timeout_s=self.timeout,
                passes=[Pass("in_flight", concurrency=c)],
            )
            return {
                "1 stream": res.tokens_per_s or 0.0,
                f"{c} in flight": res.passes["in_flight"].tokens_per_s or 0.0,
            }

        self.stage(
            "regeneration (vLLM)",
            f"output tokens/s of the target alone on {len(prompts)} prepared rows' prompts, "
            f"greedy, at most {max_tokens} tokens each, one request at a time and {c} in "
            "flight (data.server.concurrency); the regeneration engine",
            self.args.rounds,
            run,
        )

    def extraction(self) -> None:
        from eagle3_pipeline.extract.hf_backend import extract_hf
        from eagle3_pipeline.extract.view import ExtractInputs

        rows = self.rows_dir()

        def run(dtype: str) -> dict[str, float]:
            with tempfile.TemporaryDirectory(prefix="bench_precision_hs_") as tmp:
                cfg = load_workdir_config(
                    self.work,
                    [
                        f"model.dtype={dtype}",
                        "extract.mode=offline",
                        "extract.backend=hf",
                        "extract.rank=0",
                        "extract.world_size=1",
                        f"paths.prepared={rows}",
                        f"paths.hidden_states={tmp}/hs",
                        f"paths.details={tmp}/details",
                    ],
                )
                record = extract_hf(ExtractInputs.from_config(cfg), progress=False)
            return {"stage": record.tokens_per_s}

        self.stage(
            "extraction (hf)",
            f"row tokens/s of extract_hf over {self.args.rows} prepared rows (forward, capture "
            f"and the overlapped writes, fsync {self.cfg.extract.fsync}; model load excluded), "
            f"batch_tokens {self.cfg.extract.batch_tokens}, stored as {self.cfg.extract.dtype}",
            self.args.rounds,
            run,
        )

    def training(self) -> None:
        name = "training (train step)"
        if self.finished(name):
            return
        tokens = self.cfg.train.tokens_per_step
        what = (
            f"training tokens/s, {self.args.train_steps} optimizer steps of {tokens} tokens "
            f"per trial, one trial per round, after a warm-up step (bench/train.py measure); "
            f"bf16 = autocast over float32 master weights"
        )
        print(f"\n{name}: {what}", flush=True)
        figures: dict[str, dict[str, list[float]]] = {
            "ours": {d: [] for d in DTYPES},
            "speculators Trainer": {d: [] for d in DTYPES},
        }
        errors: dict[str, str] = {}
        facts = ""
        with tempfile.TemporaryDirectory(prefix="bench_precision_train_") as tmp:
            args = argparse.Namespace(
                steps=self.args.train_steps,
                trials=self.args.rounds,
                overrides=[
                    f"train.tokens_per_step={tokens}",
                    f"paths.train_state={tmp}/state",
                    f"paths.live={tmp}/live",
                    f"paths.details={tmp}/details",
                    f"paths.draft={tmp}/draft",
                ],
            )
            for dtype in DTYPES:
                try:
                    row = measure(self.work, dtype, args)
                except Exception as exc:
                    errors[dtype] = f"{type(exc).__name__}: {exc}"
                    print(f"  {dtype}: failed: {errors[dtype]}", flush=True)
                    continue
                figures["ours"][dtype] = row.ours
                figures["speculators Trainer"][dtype] = row.theirs
                facts = row.facts
        self.results["stages"][name] = {
            "what": f"{what}; {facts}",
            "figures": figures,
            "errors": errors,
        }
        self.save()

    def decoding(self) -> None:
        from eagle3_pipeline.serving.engine import build_engine, log_file
        from eagle3_pipeline.serving.offline import run_offline

        prompts = self.validate_prompts()
        max_tokens = self.args.max_tokens or self.cfg.validate.max_new_tokens
        k = self.cfg.train.speculative_tokens
        draft = self.work / self.cfg.paths.draft

        def run(dtype: str) -> dict[str, float]:
            engine = build_engine(self.cfg, self.spec, str(self.spec.path), "baseline", dtype=dtype)
            alone = run_offline(
                self.python,
                engine,
                [p.prompt_ids for p in prompts],
                max_tokens,
                self.stops,
                log_file(self.cfg, "bench_precision_baseline"),
                timeout_s=self.timeout,
            ).tokens_per_s
            with_draft = serve(
                self.cfg, self.spec, self.work, draft, "bench_precision", prompts, dtype, max_tokens
            )
            return {
                "target alone": alone,
                "target + draft": with_draft["tokens_per_s"],
                "speedup": with_draft["tokens_per_s"] / alone,
                "acceptance length": with_draft["acceptance_length"],
            }

        sets = ", ".join(dict.fromkeys(p.set for p in prompts))
        self.stage(
            "vLLM decoding",
            f"output tokens/s, {len(prompts)} validate prompts ({sets}), greedy, at most "
            f"{max_tokens} tokens each, one request at a time; the work dir's draft at K={k}; "
            "speedup = with / without the draft, paired per round (not a tokens/s figure); "
            "acceptance length: vLLM's counters in that engine",
            self.args.rounds,
            run,
        )

    def acceptance(self) -> None:
        from eagle3_pipeline.train.record import TrainRecord

        prompts = self.validate_prompts()
        max_tokens = self.args.max_tokens or self.cfg.validate.max_new_tokens
        for dtype in DTYPES:
            name = f"trained in {dtype}"
            if "error" not in self.results["acceptance"].get(name, {"error": "not run"}):
                continue
            where = self.out / f"train_{dtype}"
            print(f"\n{name}: the train stage with train.dtype={dtype} into {where}", flush=True)
            try:
                run = train_variant(self.work, where, [f"train.dtype={dtype}"])
                record = TrainRecord.read(where / "details" / "train.json")
                print(f"  serving {run['draft']} in vLLM (float32)", flush=True)
                served = serve(
                    self.cfg,
                    self.spec,
                    self.work,
                    Path(run["draft"]),
                    f"precision_{dtype}",
                    prompts,
                    "float32",
                    max_tokens,
                )
            except (Exception, SystemExit) as exc:
                self.results["acceptance"][name] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"  failed: {exc}", flush=True)
                self.save()
                continue
            self.results["acceptance"][name] = {
                **served,
                "draft": str(run["draft"]),
                "steps": run["steps"],
                "train_s": run["train_s"],
                "train_tokens_per_s": record.tokens_per_s,
                "val_loss": record.val_loss,
                "train_dtype": record.dtype,
            }
            per_set = ", ".join(f"{s} {x:.3f}" for s, x in served["by_set"].items())
            print(
                f"  acceptance length {served['acceptance_length']:.3f} ({per_set}); "
                f"{run['steps']} steps in {run['train_s']:.0f} s",
                flush=True,
            )
            self.save()
        self.results["acceptance_what"] = (
            f"vLLM's mean acceptance length (1 + accepted / drafts), float32 engines, K="
            f"{self.cfg.train.speculative_tokens}, T=0, one request at a time, {len(prompts)} "
            f"validate prompts, at most {max_tokens} tokens each; each draft: the work dir's "
            f"train stage ({self.cfg.train.epochs} epochs, same rows and seed) in that dtype"
        )
        self.save()

    # ------------------------------------------------------------------ the tables

    def print_tables(self) -> None:
        print("\n| stage | figure | float32 | bf16 | bf16/float32 |")
        print("|---|---|---:|---:|---:|")
        for name, st in self.results["stages"].items():
            for fig, per in st["figures"].items():
                a, b = _median(per["float32"]), _median(per["bfloat16"])
                ratio = f"{b / a:.2f}x" if a and b else "-"
                print(f"| {name} | {fig} | {_fmt(a)} | {_fmt(b)} | {ratio} |")
        for name, st in self.results["stages"].items():
            print(f"- {name}: {st['what']}")
            for dtype, err in st["errors"].items():
                print(f"  {dtype} failed: {err}")
        acc = self.results["acceptance"]
        if not acc:
            return
        sets = list(dict.fromkeys(s for r in acc.values() for s in r.get("by_set", {})))
        print(f"\n| draft | pooled | {' | '.join(sets)} | steps | train s | val loss |")
        print("|---|---:|" + "---:|" * (len(sets) + 3))
        for name, r in acc.items():
            if "error" in r:
                print(f"| {name} | failed: {r['error']} |")
                continue
            by = [f"{r['by_set'].get(s, 0):.3f}" for s in sets]
            print(
                f"| {name} | {r['acceptance_length']:.3f} | {' | '.join(by)} | {r['steps']} "
                f"| {r['train_s']:.0f} | {r['val_loss']:.3f} |"
            )
        print(f"- {self.results.get('acceptance_what', '')}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workdir", type=Path, default=Path("."))
    ap.add_argument("--out", type=Path, default=Path("bench_out/precision"))
    ap.add_argument("--rounds", type=int, default=2, help="rounds per stage (trials: training)")
    ap.add_argument("--rows", type=int, default=32, help="prepared rows: regeneration, extraction")
    ap.add_argument("--train-steps", type=int, default=8, help="optimizer steps per trial")
    ap.add_argument("--prompts", type=int, default=None, help="validate prompts (default: all)")
    ap.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="tokens per vLLM answer (default: data.max_new_tokens for regeneration, "
        "validate.max_new_tokens for decoding and acceptance)",
    )
    ap.add_argument("--prompt-sets", nargs="+", default=None, help="default: validate.prompt_sets")
    ap.add_argument("--skip-acceptance", action="store_true", help="no drafts trained and served")
    ap.add_argument("--resume", action="store_true", help="keep the parts precision.json holds")
    args = ap.parse_args()

    import torch

    from eagle3_pipeline.runtime.cpu import read_this_cpu

    cpu = read_this_cpu()
    print(
        f"CPU: {cpu.describe()}; flags {' '.join(cpu.flags or [])}; torch {torch.__version__} "
        f"(capability {cpu.torch.capability}), {torch.get_num_threads()} threads, "
        f"{os.cpu_count()} CPUs",
        flush=True,
    )
    bench = Bench(args)
    bench.results["cpu"] = {
        "model": cpu.model,
        "bf16": cpu.bf16,
        "describe": cpu.describe(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }
    print(f"work directory {bench.work} ({bench.cfg.model.name}); writing {bench.out}", flush=True)
    bench.regeneration()
    bench.extraction()
    bench.training()
    bench.decoding()
    if not args.skip_acceptance:
        bench.acceptance()
    bench.save()
    bench.print_tables()
    print(f"wrote {bench.out / 'precision.json'}")


if __name__ == "__main__":
    main()
