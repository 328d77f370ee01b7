"""Benchmark: tokens/s of the train stage's step vs speculators' own ``Trainer`` step.

Same data (the prepared rows + hidden states of the working directory), same packed
batches, same draft shape and device; speculators' ``Trainer`` runs with only the patches
of ``eagle3_pipeline.compat.speculators.speculators_trainer``. Trials are interleaved
(ours, theirs, ours, ...) so that load from other processes hits both alike; the medians
of 5 are reported, and the median of the per-trial (paired) ratios.

Run from a working directory that holds data/target, data/prepared, data/hidden_states:

    python bench/train.py [--trials 5] [--steps 8] [key=value ...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any


def _tokens(batches: list[dict[str, Any]]) -> float:
    return float(sum(int((b["document_ids"] != -1).sum()) for b in batches))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per trial")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    import torch
    from speculators.train.trainer import TrainerConfig
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    from eagle3_pipeline.compat.speculators import speculators_trainer
    from eagle3_pipeline.core.config import load_config
    from eagle3_pipeline.train.distributed import Dist
    from eagle3_pipeline.train.loop import DraftTrainer, _RunCounters
    from eagle3_pipeline.train.plan import plan_training
    from eagle3_pipeline.train.prefetch import prefetch
    from eagle3_pipeline.train.view import TrainInputs

    cfg = load_config(["train.tokens_per_step=1024", "train.hidden_noise=0.05", *args.overrides])
    plan = plan_training(TrainInputs.from_config(cfg))
    ours = DraftTrainer(TrainInputs.from_config(cfg), plan, Dist(), progress=False)
    # speculators' stock path: its Trainer, and the draft with its own attention for the
    # device (sdpa: flex attention has no CPU backward; on CUDA both use flex attention)
    stock = (
        cfg
        if plan.runtime.device == "cuda"
        else load_config(
            [
                "train.tokens_per_step=1024",
                "train.hidden_noise=0.05",
                *args.overrides,
                "train.attn_implementation=sdpa",
            ]
        )
    )
    other = DraftTrainer(
        TrainInputs.from_config(stock),
        plan_training(TrainInputs.from_config(stock)),
        Dist(),
        progress=False,
    )
    all_batches = ours.epoch_batches(ours.train_ds, 0)
    need = args.steps * args.trials + 1
    while len(all_batches) < need:
        all_batches += all_batches
    loader = ours.loader(ours.train_ds, [])
    collate = loader.collate_fn

    def slice_loader(k: int) -> DataLoader:
        idx = all_batches[1 + k * args.steps : 1 + (k + 1) * args.steps]
        return DataLoader(ours.train_ds, batch_sampler=idx, collate_fn=collate, num_workers=0)

    with tempfile.TemporaryDirectory() as tmp:
        tcfg = TrainerConfig(
            lr=cfg.train.lr,
            num_epochs=1,
            save_path=tmp,
            train_call_kwargs=ours.call_kwargs(),
            val_call_kwargs=ours.call_kwargs(),
            weight_decay=cfg.train.weight_decay,
            scheduler_type="cosine",
            scheduler_total_steps=need,
            hidden_states_dtype=getattr(torch, plan.runtime.dtype),
            log_freq=10**9,
        )
        theirs = speculators_trainer(
            other.model, tcfg, slice_loader(0), None, device=str(other.device)
        )
        # warm-up: one step each (allocator, first-call overheads)
        first = DataLoader(ours.train_ds, batch_sampler=all_batches[:1], collate_fn=collate)
        for b in first:
            ours.train_step(b, 0)
        theirs.train_loader = first
        theirs.train_epoch(0)

        bar, run = tqdm(disable=True), _RunCounters()
        ours_tps: list[float] = []
        theirs_tps: list[float] = []
        for k in range(args.trials):
            batches = list(slice_loader(k))  # the same tensors for both; noise is added per step
            tokens = _tokens(batches)

            def run_ours(k: int = k, tokens: float = tokens) -> None:
                # the train stage's own path: batches prefetched by a thread, each step's
                # figures read back once per train.log_every_steps window
                t0 = time.perf_counter()
                for b in prefetch(slice_loader(k), ours.prefetch):
                    ours._step(bar, 0, b, run)
                ours.flush_steps(bar, run)
                ours_tps.append(tokens / (time.perf_counter() - t0))

            def run_theirs(k: int = k, tokens: float = tokens) -> None:
                theirs.train_loader = slice_loader(k)
                t0 = time.perf_counter()
                theirs.train_epoch(0)
                theirs_tps.append(tokens / (time.perf_counter() - t0))

            for fn in (run_ours, run_theirs) if k % 2 == 0 else (run_theirs, run_ours):
                fn()
            print(
                f"trial {k}: ours {ours_tps[-1]:,.0f} tok/s, speculators Trainer "
                f"{theirs_tps[-1]:,.0f} tok/s"
            )

    mo, mt = statistics.median(ours_tps), statistics.median(theirs_tps)
    print(
        f"device {plan.runtime.device}, dtype {plan.runtime.dtype}, attention {ours.attn} "
        f"(speculators: {other.attn}), prefetch {ours.prefetch}, "
        f"loss {ours.loss_impl}, {cfg.train.tokens_per_step} tokens/step, "
        f"{args.steps} steps x {args.trials} trials, threads {torch.get_num_threads()}"
    )
    print(f"median tokens/s: train stage {mo:,.0f}, speculators Trainer {mt:,.0f}")
    paired = statistics.median(o / t for o, t in zip(ours_tps, theirs_tps, strict=True))
    print(f"ratio of medians (train stage / speculators Trainer): {mo / mt:.3f}")
    print(f"median of per-trial ratios (robust to load changing between trials): {paired:.3f}")


if __name__ == "__main__":
    main()
