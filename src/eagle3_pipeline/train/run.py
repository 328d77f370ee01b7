"""One training run in this process: the whole run on CPU, or one torchrun rank."""

from __future__ import annotations

import time
from typing import Any

from eagle3_pipeline.core.config import Config
from eagle3_pipeline.train.distributed import close_distributed, init_distributed
from eagle3_pipeline.train.loop import DraftTrainer
from eagle3_pipeline.train.metrics import run_metrics
from eagle3_pipeline.train.plan import plan_training
from eagle3_pipeline.train.save import save_draft
from eagle3_pipeline.train.state import full_state_dict


def train(cfg: Config, progress: bool = True) -> dict[str, Any]:
    """Train (or resume) the draft; on rank 0 write data/draft and the curves (dvclive).

    Returns the metrics dict (rank 0) or ``{}`` on other ranks.
    """
    t_start = time.perf_counter()
    plan = plan_training(cfg)
    d = init_distributed(plan.runtime.device)
    try:
        trainer = DraftTrainer(cfg, plan, d, progress=progress)
        result = trainer.run()
        # under FSDP a gather (every rank), rank 0 saves; else the model's own state dict
        full = full_state_dict(trainer.model, "fsdp") if trainer.parallel == "fsdp" else None
        if not d.main:
            return {}
        config = save_draft(trainer.model, plan.paths.draft, cfg.train.speculative_tokens,
                            state_dict=full)
        if trainer.curves is not None:
            trainer.curves.finish(trainer.history, trainer.k)
        return run_metrics(cfg, trainer, result, config, time.perf_counter() - t_start)
    finally:
        close_distributed(d)
