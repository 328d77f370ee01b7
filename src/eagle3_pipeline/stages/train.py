"""Stage `train`: train the EAGLE-3 draft on the extracted hidden states.

Writes data/draft/ (speculators format, what validate loads), data/train_state/ (resumable
state, the stage's own: not a DVC output), dvclive/train/ (curves as they train, curves.png, the summary
DVC shows) and metrics/details/train.json (every figure). On CPU it trains in this process; on CUDA it launches torchrun with one
worker per GPU of the hardware profile and, once they have exited, records NVML's view of
the GPUs (memory back to preflight's reading, no process left holding a GPU). With
``train.nproc=N`` (N > 1) on CPU it starts the same torchrun launch, N gloo workers.
When the extract stage recorded ``extract.mode=online``, this stage first starts the target
in vLLM (its extraction engine) and every worker reads each batch's hidden states from it;
the server stops with the stage. With ``hardware.nodes=N`` every node runs this stage
(``EAGLE3_NODE_RANK``, ``EAGLE3_MASTER_ADDR``: see :mod:`eagle3_pipeline.train.nodes`),
each starting one torchrun agent; node 0's records the run.
"""

from __future__ import annotations

import logging
import os

from eagle3_pipeline.core.errors import StageError
from eagle3_pipeline.core.io import remove_path
from eagle3_pipeline.core.metrics import details_path, read_details, write_details
from eagle3_pipeline.core.records import RecordError
from eagle3_pipeline.preflight.record import PreflightRecord
from eagle3_pipeline.runtime.gpu import GpuSnapshot
from eagle3_pipeline.stages.runner import run_stage
from eagle3_pipeline.train.nodes import NODE_RANK_ENV, this_node
from eagle3_pipeline.train.view import TrainInputs

log = logging.getLogger(__name__)

INPUTS = TrainInputs


def run(cfg: TrainInputs) -> None:
    from eagle3_pipeline.train.launch import run_training
    from eagle3_pipeline.train.live import write_summary
    from eagle3_pipeline.train.plan import TrainPaths

    if not this_node(cfg.hardware.nodes).main:
        run_training(cfg)  # node 0's stage records the run
        log.info("this node's workers finished; node 0 records the run")
        return
    before = preflight_snapshot(cfg)
    remove_path(details_path(cfg, "train"))
    record = run_training(cfg, before)
    if record is None:  # node 0's run returns its record; None means it wrote none
        raise StageError("the training run returned no record; see the log above")
    write_details(cfg, record)
    write_summary(TrainPaths.from_config(cfg).live, record)
    log.info(
        "draft: val loss %.4f (untrained %.4f), per-position accuracy %s, %d steps, %.0f tokens/s",
        record.val_loss,
        record.val_loss_untrained or float("nan"),
        [round(a, 3) for a in record.val_accuracy_per_position],
        record.steps,
        record.tokens_per_s,
    )


def preflight_snapshot(cfg: TrainInputs) -> GpuSnapshot | None:
    """The preflight stage's GPU reading (its record's ``snapshot``), which the reading
    after training is compared with; None without one. A record this pipeline cannot read
    is a warning: the comparison is a check of the run, not a reason to refuse it."""
    try:
        pre = read_details(cfg, PreflightRecord)
    except RecordError as exc:
        log.warning("GPU memory after training will not be compared with preflight's: %s", exc)
        return None
    return pre.snapshot if pre is not None else None


def main(argv: list[str] | None = None) -> None:
    # a node other than 0 writes no output: it has none of its own to restore
    main_node = os.environ.get(NODE_RANK_ENV, "0").strip() in ("", "0")
    run_stage("train", __doc__ or "", INPUTS.from_config, run, argv, restore_on_failure=main_node)


if __name__ == "__main__":
    main()
