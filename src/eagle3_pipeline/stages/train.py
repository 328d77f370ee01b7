"""Stage `train`: train the EAGLE-3 draft on the extracted hidden states.

Writes data/draft/ (speculators format, what validate loads), data/train_state/ (resumable
state; DVC `persist`), dvclive/train/ (curves as they train, curves.png, the summary
DVC shows) and metrics/details/train.json (every figure). On CPU it trains in this process; on CUDA it launches torchrun with one
worker per GPU of the hardware profile and, once they have exited, records NVML's view of
the GPUs (memory back to preflight's reading, no process left holding a GPU). With
``train.nproc=N`` (N > 1) on CPU it starts the same torchrun launch, N gloo workers.
When the extract stage recorded ``extract.mode=online``, this stage first starts the target
in vLLM (its extraction engine) and every worker reads each batch's hidden states from it;
the server stops with the stage.
"""

from __future__ import annotations

import logging

from eagle3_pipeline.core.config import Config
from eagle3_pipeline.core.io import remove_path
from eagle3_pipeline.core.metrics import details_path, write_stage_metrics
from eagle3_pipeline.stages.runner import run_stage

log = logging.getLogger(__name__)


def run(cfg: Config) -> None:
    from eagle3_pipeline.train.launch import run_training
    from eagle3_pipeline.train.live import write_summary
    from eagle3_pipeline.train.plan import TrainPaths

    remove_path(details_path(cfg, "train"))
    metrics = run_training(cfg)
    write_stage_metrics(cfg, "train", metrics)
    write_summary(TrainPaths.from_config(cfg).live, metrics)
    log.info(
        "draft: val loss %.4f (untrained %.4f), per-position accuracy %s, %d steps, "
        "%.0f tokens/s", metrics["val_loss"], metrics["val_loss_untrained"] or float("nan"),
        [round(a, 3) for a in metrics["val_accuracy_per_position"]], metrics["steps"],
        metrics["tokens_per_s"],
    )


def main(argv: list[str] | None = None) -> None:
    run_stage("train", __doc__ or "", run, argv)


if __name__ == "__main__":
    main()
