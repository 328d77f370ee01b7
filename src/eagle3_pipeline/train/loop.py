"""The training loop: one process, or one torchrun rank.

Design decision -- a lean loop over speculators' parts, not speculators' ``Trainer``:
everything that defines what the draft learns is speculators' code, used as is: the
``Eagle3DraftModel`` (its TTT unrolled forward, loss and per-position accuracy), its config
and vocabulary mapping, its ``ArrowDataset`` + ``CollateFn`` + multipack sampler +
``shift_batch`` reading the rows and ``hs_{i}`` files. What this package owns is the loop
around them, because the ``Trainer`` gets in the way of each requirement of this stage: it
does not run on CPU without four patches (device 0, accelerator synchronize, autocast type,
checkpoint device); it checkpoints per epoch into its own directory layout, without the RNG
state or a config fingerprint, so a DVC ``persist`` directory left by other params would be
resumed silently; it has no hook for training-only noise; and its metrics go to its
loggers, not to files DVC tracks. The compat module still carries the patches that make its
``Trainer`` run on CPU, and ``bench/train.py`` measures this loop's step against it on the
same data and draft.

The noise is drawn from a generator seeded by (seed, step, rank), so a resumed run draws
the same noise as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from eagle3_pipeline.compat.speculators_argmax import argmax_by_max
from eagle3_pipeline.core.choices import CheckpointMeasure
from eagle3_pipeline.draft.shape import build_draft, build_vocab_mapping, load_token_freq
from eagle3_pipeline.runtime.faults import PREFIX, fault_after
from eagle3_pipeline.train import warm_start
from eagle3_pipeline.train.batches import epoch_batches, load_split, make_loader
from eagle3_pipeline.train.distributed import (
    Dist,
    all_reduce_ints,
    all_reduce_sums,
    wrap_parallel,
)
from eagle3_pipeline.train.errors import SimulatedFailure
from eagle3_pipeline.train.inputs import target_model_dir
from eagle3_pipeline.train.live import History, LiveCurves
from eagle3_pipeline.train.losses import loss_config
from eagle3_pipeline.train.metrics import accumulate, summarize
from eagle3_pipeline.train.optim import build_optimizer
from eagle3_pipeline.train.plan import TrainPlan
from eagle3_pipeline.train.prefetch import prefetch
from eagle3_pipeline.train.record import EpochSharding
from eagle3_pipeline.train.runtime import cuda_attention, cuda_loss
from eagle3_pipeline.train.save import save_draft
from eagle3_pipeline.train.select import Selection, candidate
from eagle3_pipeline.train.state import (
    EPOCH_DRAFTS,
    full_state_dict,
    load_state,
    save_state,
    trainable_state,
)

log = logging.getLogger(__name__)

# Test-only fault (EAGLE3_FAULT_TRAIN_FAIL_AFTER_STEPS): raise after this many steps of a
# run, once the periodic state is written, as a killed run would leave it.
FAULT_NAME = "train_fail_after_steps"


@dataclass
class _RunCounters:
    """What this run (not the resumed one before it) did: for throughput and ``resumed``."""

    steps: int = 0
    tokens: float = 0.0
    train_s: float = 0.0


class DraftTrainer:
    """One training run (one process, or one torchrun rank)."""

    def __init__(self, plan: TrainPlan, d: Dist, progress: bool = True) -> None:
        import torch

        self.plan, self.d, self.progress = plan, d, progress
        self.t = plan.train
        self.seed = plan.seed
        self.k = plan.train.speculative_tokens
        rt = plan.runtime
        self.device = torch.device(f"cuda:{d.local_rank}" if rt.device == "cuda" else "cpu")
        self.attn = rt.attn_implementation or cuda_attention(self.device, plan.shape)
        self.loss_impl = rt.loss_implementation or cuda_loss()
        if self.loss_impl == "fused":
            from eagle3_pipeline.compat.speculators import separate_fused_loss_configs

            separate_fused_loss_configs()
        self.autocast_dtype = getattr(torch, rt.dtype) if rt.dtype != "float32" else None
        self.hs_dtype = getattr(torch, rt.dtype)
        # a process group started outside the stage (a hand-run torchrun) still gets DDP
        self.parallel = (rt.parallel if rt.parallel != "none" else "ddp") if d.world > 1 else "none"
        self.model = self._build_model()
        self.prefetch = (
            self.t.prefetch_batches
            if self.t.prefetch_batches is not None
            else 2
            if (self.device.type == "cuda" or plan.online)
            else 0
        )
        self.train_ds = load_split(plan, self.t, "train", self.hs_dtype)
        self.val_ds = load_split(plan, self.t, "val", self.hs_dtype)
        # the multipack sampler packs each epoch's permutation differently: count them all
        self.steps_per_epoch = [
            len(self.epoch_batches(self.train_ds, e)) for e in range(self.t.epochs)
        ]
        self.total_steps = sum(self.steps_per_epoch)
        if self.t.max_steps is not None:
            self.total_steps = min(self.total_steps, self.t.max_steps)
        self.ddp_model = wrap_parallel(
            self.model, self.parallel, d, self.device, self.autocast_dtype
        )
        self.optimizer, self.scheduler = build_optimizer(
            self.model, self.t, self.total_steps, rt.dtype
        )
        self.global_step = 0
        self.history = History()
        self.curves: LiveCurves | None = None  # rank 0 only, from run() on
        self.val_loss_untrained: float | None = None
        self.val_untrained: dict[str, Any] | None = None
        self.last_val: dict[str, Any] | None = None
        self.sharding: list[EpochSharding] = []  # per epoch: which rank trained on which rows
        # which epoch's draft is written (train.select) and when to stop (train.patience)
        self.selection = Selection(str(self.t.select), self.t.patience)
        self.fail_after = fault_after(FAULT_NAME)
        self._kwargs: dict[str, Any] | None = None
        # steps whose figures are still on the device: (global step, epoch, train_step's out)
        self._pending: list[tuple[int, int, dict[str, Any]]] = []
        self._window_t0 = 0.0

    # -- construction

    def _build_model(self) -> Any:
        import torch

        p = self.plan
        torch.manual_seed(self.seed)
        source = None
        if p.init_dir is not None:  # warm start: the source's weights and vocabulary
            source = warm_start.load_source(p.init_dir, target_model_dir(p.spec))
            held = warm_start.weight_shapes(p.init_dir)  # the frozen tensors it has
            d2t, t2d = warm_start.vocab(source)
        else:
            freq = load_token_freq(p.paths.prepared / "token_freq.pt")
            d2t, t2d = build_vocab_mapping(
                freq,
                self.t.draft_vocab_size,
                p.spec.vocab_size,
                list(p.required_tokens.values()),
            )
        model = build_draft(
            p.spec,
            p.shape,
            self.k,
            self.t.draft_vocab_size,
            d2t,
            t2d,
            target_model_dir(p.spec),
            self.attn,
            norm_before_residual=self.t.draft.norm_before_residual,
            options=self.t.draft,
        )
        if source is not None:
            n = warm_start.copy_weights(model, source, held)
            where = p.init.path if p.init is not None else p.init_dir
            log.info("warm start: %d tensors from %s", n, where)
            del source
        return model.to(self.device)

    def epoch_batches(self, ds: Any, epoch: int) -> list[list[int]]:
        """This rank's batches (row ids) of ``epoch`` of ``ds``."""
        return epoch_batches(ds, self.t, self.seed, self.d, epoch)

    def loader(self, ds: Any, batches: list[list[int]]) -> Any:
        """Collated batches of ``ds`` in the order of ``batches``."""
        return make_loader(ds, batches, self.t, self.plan.spec, self.hs_dtype)

    # -- one step

    def call_kwargs(self) -> dict[str, Any]:
        """speculators' forward arguments: TTT steps, their loss decay, the loss."""
        if self._kwargs is None:
            self._kwargs = {
                "ttt_steps": self.k,
                "ttt_step_loss_decay": self.t.ttt_step_loss_decay,
                "loss_config": loss_config(self.t.loss, self.loss_impl),
            }
        return self._kwargs

    def _to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        keys = (
            "hidden_states",
            "input_ids",
            "verifier_last_hidden_states",
            "loss_mask",
            "position_ids",
            "document_ids",
        )
        return {k: batch[k].to(self.device, non_blocking=True) for k in keys}

    @contextlib.contextmanager
    def _forward_context(self) -> Iterator[None]:
        """The forward's context: autocast to the run's precision, and speculators'
        argmaxes by ``max`` (compat/speculators_argmax.py: the same tokens, faster)."""
        import torch

        with contextlib.ExitStack() as stack:
            stack.enter_context(argmax_by_max())
            if self.autocast_dtype is not None:
                stack.enter_context(torch.autocast(self.device.type, dtype=self.autocast_dtype))
            yield

    def add_noise(self, batch: dict[str, Any], step: int) -> None:
        """Uniform noise of width ``train.hidden_noise`` on the input hidden states (not
        on the verifier's final state, which defines the targets); seeded per step."""
        import torch

        if self.t.hidden_noise <= 0:
            return
        hs = batch["hidden_states"]
        gen = torch.Generator(device="cpu").manual_seed(
            (self.seed * 1_000_003 + step * 7919 + self.d.rank) % (2**63)
        )
        noise = torch.rand(hs.shape, generator=gen, dtype=torch.float32)
        noise.sub_(0.5).mul_(self.t.hidden_noise)  # in place: the same values, no copies
        # added where the batch already is (on CUDA the pinned batch went over as is)
        batch["hidden_states"] = hs + noise.to(hs.device, hs.dtype, non_blocking=True)

    def train_step(self, batch: dict[str, Any], step: int) -> dict[str, Any]:
        """One optimizer step; this rank's metric sums and the learning rate it used."""
        import torch

        gb = self._to_device(batch)
        self.add_noise(gb, step)
        with self._forward_context():
            _tokens, loss, metrics = self.ddp_model(**gb, **self.call_kwargs())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.t.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.t.grad_clip)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        # the figures stay on the device: read back once per log window (flush_steps)
        keys = sorted(k for k in metrics if k.endswith(("_sum", "_total")))
        values = torch.stack(
            [
                torch.as_tensor(metrics[k], device=self.device)
                .detach()
                .to(torch.float64)
                .reshape(())
                for k in keys
            ]
            + [(gb["document_ids"] != -1).sum().to(torch.float64)]
        )
        return {"keys": [*keys, "tokens_sum"], "values": values, "lr": lr}

    # -- validation

    def validate(self) -> dict[str, Any]:
        """Loss and accuracies on the held-out rows, summed over the ranks."""
        import torch

        self.model.eval()
        sums: dict[str, float] = {}
        batches = self.epoch_batches(self.val_ds, 0)
        with torch.no_grad():
            ahead = prefetch(
                self.loader(self.val_ds, batches),
                self.prefetch,
                pin_memory=self.device.type == "cuda",
            )
            with contextlib.closing(ahead):  # stops the thread if a forward fails
                for batch in ahead:
                    gb = self._to_device(batch)
                    with self._forward_context():
                        _tokens, _loss, metrics = self.model(**gb, **self.call_kwargs())
                    accumulate(sums, metrics)
        self.model.train()
        sums = all_reduce_sums(sums, self.d, self.device)
        return summarize(sums, self.k)

    def _record_sharding(self, epoch: int, seen: list[int]) -> None:
        """Per epoch: rows each rank trained on, and how many rows more than one rank
        trained on (0 when the data is sharded)."""
        n = len(self.train_ds)
        counts = [0] * n
        for i in seen:
            counts[i] += 1
        per_rank = [0] * self.d.world
        per_rank[self.d.rank] = len(seen)
        total = all_reduce_ints(counts + per_rank, self.d)
        counts, per_rank = total[:n], total[n:]
        self.sharding.append(
            EpochSharding(
                epoch=epoch,
                rows_per_rank=per_rank,
                rows_seen=sum(1 for c in counts if c),
                rows_on_several_ranks=sum(1 for c in counts if c > 1),
                train_rows=n,
            )
        )

    # -- the run

    def run(self) -> dict[str, Any]:
        """Train to ``total_steps`` (resuming a matching state); what this run did and the
        last validation."""
        from tqdm.auto import tqdm

        resume = load_state(self)
        if resume is None:
            self.val_untrained = self.validate()
            self.val_loss_untrained = self.val_untrained["loss"]
            start_epoch, skip = 0, 0
        else:
            start_epoch, skip = resume
        if self.d.main:
            self.curves = LiveCurves(self.plan.paths.live, self.history)
        bar = tqdm(
            total=self.total_steps,
            initial=self.global_step,
            desc="train draft",
            unit="step",
            mininterval=1.0,
            disable=not (self.progress and self.d.main),
        )
        try:
            return self._loop(bar, start_epoch, skip)
        finally:
            bar.close()

    def _done(self) -> bool:
        return self.global_step >= self.total_steps

    def _loop(self, bar: Any, start_epoch: int, skip: int) -> dict[str, Any]:
        run = _RunCounters()
        self.model.train()
        for epoch in range(start_epoch, self.t.epochs):
            if self._done():
                break
            batches = self.epoch_batches(self.train_ds, epoch)
            start = skip if epoch == start_epoch else 0
            step_in_epoch = self._train_epoch(bar, epoch, batches, start, run)
            if (step_in_epoch == len(batches) or self._done()) and self._end_epoch(epoch):
                break
        if self.last_val is None:
            self.last_val = self.validate()
        return {
            "steps_this_run": run.steps,
            "tokens_this_run": run.tokens,
            "train_s": run.train_s,
            # the figures of the draft that is written: the chosen epoch's
            "val": self.selection.best_val or self.last_val,
        }

    def _train_epoch(
        self, bar: Any, epoch: int, batches: list[list[int]], start: int, run: _RunCounters
    ) -> int:
        """Steps of ``epoch`` from batch ``start`` on; the position reached in the epoch."""
        step_in_epoch = start
        todo = batches[start:]
        # a resumed epoch's first batches were trained by the killed run, on this rank
        # (the fingerprint guarantees the same plan)
        seen = [i for b in batches[:start] for i in b]
        self._window_t0 = time.perf_counter()
        batches_ahead = prefetch(
            self.loader(self.train_ds, todo), self.prefetch, pin_memory=self.device.type == "cuda"
        )
        try:
            for rows, batch in zip(todo, batches_ahead, strict=True):
                seen.extend(rows)
                self._step(bar, epoch, batch, run)
                step_in_epoch += 1
                end_of_epoch = step_in_epoch == len(batches)
                every = max(1, self.t.checkpoint_every_steps)
                if not (self._done() or end_of_epoch) and self.global_step % every == 0:
                    self.flush_steps(bar, run)
                    save_state(self, epoch, step_in_epoch)
                    self._window_t0 = time.perf_counter()  # a checkpoint is not training
                self._inject_fault(run)
                if self._done():
                    break
        finally:
            batches_ahead.close()  # stops the prefetch thread when leaving early
        self.flush_steps(bar, run)
        self._record_sharding(epoch, seen)
        return step_in_epoch

    def _step(self, bar: Any, epoch: int, batch: dict[str, Any], run: _RunCounters) -> None:
        out = self.train_step(batch, self.global_step)
        self.global_step += 1
        run.steps += 1
        self._pending.append((self.global_step, epoch, out))
        if len(self._pending) >= max(1, self.t.log_every_steps):
            self.flush_steps(bar, run)

    def flush_steps(self, bar: Any, run: _RunCounters) -> None:
        """Read back the pending steps' figures (one host sync, one all-reduce over the
        ranks for the whole window) and log every step of it: each step's own loss and
        accuracies, the window's tokens/s (a per-step wall time would only time the kernel
        launches on CUDA)."""
        import torch

        if not self._pending:
            return
        pending, self._pending = self._pending, []
        # the window: from the previous read-back (or the epoch's start) to this one,
        # waits for batches included, so tokens/s is what training delivers
        keys = pending[0][2]["keys"]
        table = torch.stack([out["values"] for _, _, out in pending])
        if self.d.world > 1:
            import torch.distributed as dist

            dist.all_reduce(table)
        rows = table.tolist()
        dt = time.perf_counter() - self._window_t0
        tokens = sum(r[-1] for r in rows)
        run.tokens += tokens
        run.train_s += dt
        rate = tokens / dt if dt > 0 else 0.0
        for (step, epoch, out), values in zip(pending, rows, strict=True):
            sums = dict(zip(keys, values, strict=True))
            row = summarize(sums, self.k)
            point = self.history.log_step(step, epoch, row, out["lr"], rate)
            if self.curves is not None:
                self.curves.log_step(point)
        bar.update(len(pending))
        bar.set_postfix(
            loss=f"{row['loss']:.3f}", acc0=f"{row['accuracy_per_position'][0]:.2f}", refresh=False
        )
        self._window_t0 = time.perf_counter()

    def _inject_fault(self, run: _RunCounters) -> None:
        if self.fail_after is not None and run.steps >= self.fail_after:
            raise SimulatedFailure(
                f"{PREFIX}{FAULT_NAME.upper()}={self.fail_after}: simulated failure at "
                f"step {self.global_step} (test-only fault)"
            )

    def _end_epoch(self, epoch: int) -> bool:
        """Validate, offer the epoch's draft to the choice (``train.select``), record its
        curve point and save the state at its end; True when ``train.patience`` ends the
        run here."""
        val = self.validate()
        point = self.history.log_epoch(epoch, self.global_step, val)
        if self.curves is not None:
            self.curves.log_epoch(point)
        cand = candidate(epoch, self.global_step, val)
        if self.selection.offer(cand, val) and self.t.select != CheckpointMeasure.last:
            # a copy: on CPU the state dict's tensors are the live parameters (under FSDP a
            # gather, on every rank; the verdict is the same on all: val is all-reduced)
            kept = trainable_state(self.model, self.parallel)
            self.selection.best_weights = {n: t.clone() for n, t in kept.items()}
        stop = self.selection.out_of_patience() and not self._done()
        stop = stop and epoch + 1 < self.t.epochs
        self.selection.stopped_early = stop
        best = self.selection.candidates[self.selection.best or 0]
        log.info(
            "epoch %d: val loss %.4f, per-position accuracy %s, val acceptance %.3f "
            "(best by %s: epoch %d)%s",
            epoch,
            val["loss"],
            [round(a, 3) for a in val["accuracy_per_position"]],
            cand.val_acceptance,
            self.t.select,
            best.epoch,
            f"; no better draft for {self.t.patience} epochs: stopping" if stop else "",
        )
        if self.t.keep_epoch_drafts:
            self._save_epoch_draft(epoch)
        # resumes at the start of the next epoch; finished after the last one
        last = self._done() or epoch + 1 == self.t.epochs or stop
        save_state(self, epoch + 1, 0, finished=last)
        self.last_val = val
        return stop

    def _save_epoch_draft(self, epoch: int) -> None:
        """This epoch's draft as vLLM serves it, beside the resumable state (a gather on
        every rank under FSDP; rank 0 writes)."""
        full = full_state_dict(self.model, "fsdp") if self.parallel == "fsdp" else None
        if self.d.main:
            out = self.plan.paths.state / EPOCH_DRAFTS / f"epoch_{epoch:03d}"
            save_draft(self.model, out, self.k, state_dict=full)
