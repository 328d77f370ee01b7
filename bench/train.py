"""Benchmark: tokens/s of the train stage's step vs speculators' own ``Trainer`` step, per
work directory (target) and precision.

Same data (the prepared rows + hidden states of each working directory), same packed
batches, same draft shape, optimizer (``train.optimizer``: Muon by default, as speculators'
recipe) and device; speculators' ``Trainer`` runs with only the patches of
``eagle3_pipeline.compat.speculators.speculators_trainer``. What differs is the step
itself: our packed attention (``sdpa_packed`` on CPU: per document, causal blocks by the
flash kernel's own causal path and the TTT steps' diagonal keys as dot products;
speculators' dense ``sdpa``), our loss (``cpu``: the forward KL as one autograd function;
speculators' ``eager``), our
training-only hidden-state noise (``train.hidden_noise``, which the stock step does not
add: its cost is counted against ours), our loop's batch prefetch and deferred read-back.
Trials are interleaved (ours, theirs, theirs, ours, ...) so that load from other processes
hits both alike; the medians are reported, and the median of the per-trial (paired) ratios.

Each ``--workdir`` is a finished run (``dvc repro`` / ``dvc exp run``: data/target,
data/prepared, data/hidden_states); its ``params.yaml`` is the configuration, with
``key=value`` overrides on top. Each ``--dtype`` is one training precision (float32, or
bfloat16: autocast over float32 master weights, as the train stage does); the table ends
with each precision's speed over float32's, ours and theirs. On a CPU, bf16 pays only where
the CPU computes it natively (AMX, AVX512-BF16): the table's header names the CPU.

    python bench/train.py [--workdir DIR ...] [--dtype float32 --dtype bfloat16]
                          [--trials 5] [--steps 8] [key=value ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# the bench's step: 1,024 tokens, the README's experiments' train.tokens_per_step
DEFAULTS = ["train.tokens_per_step=1024"]


@dataclass
class Row:
    """One work directory in one precision: both steps' tokens/s per trial."""

    workdir: str
    target: str
    dtype: str
    ours: list[float]
    theirs: list[float]
    facts: str

    @property
    def ours_median(self) -> float:
        return statistics.median(self.ours)

    @property
    def theirs_median(self) -> float:
        return statistics.median(self.theirs)

    @property
    def paired(self) -> float:
        return statistics.median(o / t for o, t in zip(self.ours, self.theirs, strict=True))


def _tokens(batches: list[dict[str, Any]]) -> float:
    return float(sum(int((b["document_ids"] != -1).sum()) for b in batches))


def load_workdir_config(work: Path, overrides: list[str]) -> Any:
    """The work directory's ``params.yaml`` with dotted ``key=value`` overrides on top,
    validated as the stages validate theirs."""
    from omegaconf import OmegaConf

    from eagle3_pipeline.core.config import load_params

    merged = OmegaConf.merge(
        OmegaConf.load(work / "params.yaml"), OmegaConf.from_dotlist(overrides)
    )
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(OmegaConf.to_yaml(merged))
    try:
        return load_params(f.name)
    finally:
        os.unlink(f.name)


def measure(work: Path, dtype: str, args: argparse.Namespace) -> Row:
    """Paired trials of our step and speculators' in ``work``, training in ``dtype``."""
    import torch
    from speculators.train.trainer import TrainerConfig
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    from eagle3_pipeline.compat.speculators import speculators_trainer
    from eagle3_pipeline.compat.torch_muon import newton_schulz_on_cpu
    from eagle3_pipeline.train.distributed import Dist
    from eagle3_pipeline.train.loop import DraftTrainer, _RunCounters
    from eagle3_pipeline.train.optim import MUON_DEFAULTS
    from eagle3_pipeline.train.plan import plan_training
    from eagle3_pipeline.train.view import TrainInputs

    overrides = [*DEFAULTS, *args.overrides, f"train.dtype={dtype}"]
    cfg = load_workdir_config(work, overrides)
    plan = plan_training(TrainInputs.from_config(cfg))
    ours = DraftTrainer(plan, Dist(), progress=False)
    # speculators' stock path: its Trainer, and the draft with its own attention for the
    # device (sdpa: flex attention has no CPU backward; on CUDA both use flex attention)
    stock = (
        cfg
        if plan.runtime.device == "cuda"
        else load_workdir_config(
            work, [*overrides, "train.attn_implementation=sdpa", "train.loss_implementation=eager"]
        )
    )
    other = DraftTrainer(plan_training(TrainInputs.from_config(stock)), Dist(), progress=False)
    all_batches = ours.epoch_batches(ours.train_ds, 0)
    need = args.steps * args.trials + 1
    while len(all_batches) < need:
        all_batches += all_batches
    collate = ours.loader(ours.train_ds, []).collate_fn

    def slice_loader(k: int) -> DataLoader:
        idx = all_batches[1 + k * args.steps : 1 + (k + 1) * args.steps]
        return DataLoader(ours.train_ds, batch_sampler=idx, collate_fn=collate, num_workers=0)

    t = cfg.train
    with tempfile.TemporaryDirectory() as tmp:
        tcfg = TrainerConfig(
            lr=t.lr,
            num_epochs=1,
            save_path=tmp,
            train_call_kwargs=other.call_kwargs(),
            val_call_kwargs=other.call_kwargs(),
            optimizer="muon" if str(t.optimizer) == "muon" else "adamw",
            weight_decay=t.weight_decay,
            muon_lr=t.muon_lr or t.lr,
            muon_momentum=MUON_DEFAULTS["momentum"],
            muon_weight_decay=MUON_DEFAULTS["weight_decay"],
            muon_ns_steps=MUON_DEFAULTS["ns_steps"],
            muon_adjust_lr_fn=MUON_DEFAULTS["adjust_lr_fn"],
            scheduler_type="cosine",
            scheduler_total_steps=need,
            hidden_states_dtype=getattr(torch, plan.runtime.dtype),
            log_freq=10**9,
        )
        theirs = speculators_trainer(
            other.model, tcfg, slice_loader(0), None, device=str(other.device)
        )
        # both optimizers orthogonalise in the run's precision (the train stage's rule)
        newton_schulz_on_cpu(plan.runtime.dtype)
        # warm-up: one step each (allocator, first-call overheads)
        first = DataLoader(ours.train_ds, batch_sampler=all_batches[:1], collate_fn=collate)
        for b in first:
            ours.train_step(b, 0)
        theirs.train_loader = first
        theirs.train_epoch(0)

        bar, run = tqdm(disable=True), _RunCounters()
        row = Row(str(work), cfg.model.name, plan.runtime.dtype, [], [], "")
        for k in range(args.trials):
            tokens = _tokens(list(slice_loader(k)))

            def run_ours(k: int = k, tokens: float = tokens) -> None:
                # the train stage's own path: batches prefetched by a thread, each step's
                # figures read back once per train.log_every_steps window
                t0 = time.perf_counter()
                for b in prefetch(slice_loader(k), ours.prefetch):
                    ours._step(bar, 0, b, run)
                ours.flush_steps(bar, run)
                row.ours.append(tokens / (time.perf_counter() - t0))

            def run_theirs(k: int = k, tokens: float = tokens) -> None:
                theirs.train_loader = slice_loader(k)
                t0 = time.perf_counter()
                theirs.train_epoch(0)
                row.theirs.append(tokens / (time.perf_counter() - t0))

            for fn in (run_ours, run_theirs) if k % 2 == 0 else (run_theirs, run_ours):
                fn()
            print(
                f"  {cfg.model.name} {plan.runtime.dtype} trial {k}: ours {row.ours[-1]:,.0f} "
                f"tok/s, speculators Trainer {row.theirs[-1]:,.0f} tok/s",
                flush=True,
            )
    row.facts = (
        f"attention {ours.attn} (speculators: {other.attn}), optimizer {t.optimizer}, "
        f"noise {t.hidden_noise}, prefetch {ours.prefetch}, "
        f"loss {ours.loss_impl} (speculators: {other.loss_impl}), "
        f"{t.tokens_per_step} tokens/step, {args.steps} steps x {args.trials} trials"
    )
    return row


def prefetch(loader: Any, depth: int) -> Any:
    from eagle3_pipeline.train.prefetch import prefetch as _prefetch

    return _prefetch(loader, depth)


def print_table(rows: list[Row]) -> None:
    """One line per work directory and precision; each precision over float32's."""
    base = {(r.workdir, "ours"): r.ours_median for r in rows if r.dtype == "float32"}
    base |= {(r.workdir, "theirs"): r.theirs_median for r in rows if r.dtype == "float32"}
    print()
    print(
        "| target | dtype | ours tok/s | speculators Trainer tok/s | ours / theirs (paired) "
        "| ours vs float32 | theirs vs float32 |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        vs = [
            f"{m / base[(r.workdir, who)]:.2f}x" if (r.workdir, who) in base else "-"
            for who, m in (("ours", r.ours_median), ("theirs", r.theirs_median))
        ]
        print(
            f"| {r.target} | {r.dtype} | {r.ours_median:,.0f} | {r.theirs_median:,.0f} "
            f"| {r.paired:.2f} | {vs[0]} | {vs[1]} |"
        )
    for r in rows:
        print(f"{r.target} {r.dtype}: {r.facts}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", type=Path, action="append", help="a finished run (default: .)")
    parser.add_argument(
        "--dtype",
        action="append",
        choices=["float32", "bfloat16"],
        help="training precision (default: both)",
    )
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per trial")
    parser.add_argument("overrides", nargs="*", help="key=value on top of params.yaml")
    args = parser.parse_args()

    import torch

    from eagle3_pipeline.runtime.cpu import read_this_cpu

    cpu = read_this_cpu()
    print(
        f"CPU: {cpu.model or 'unknown'}, native bf16: {cpu.bf16}; "
        f"torch {torch.__version__}, threads {torch.get_num_threads()}",
        flush=True,
    )
    rows: list[Row] = []
    here = Path.cwd()
    for work in [w.resolve() for w in args.workdir or [Path(".")]]:
        for dtype in args.dtype or ["float32", "bfloat16"]:
            os.chdir(work)  # the params' paths are relative to the work directory
            try:
                rows.append(measure(work, dtype, args))
            finally:
                os.chdir(here)
    print_table(rows)


if __name__ == "__main__":
    main()
