"""Stage `prepare`: conversations -> speculators training rows (data/prepared/, with
token_freq.pt), held-out prompts for validation (data/heldout/prompts.jsonl), every bad
input record (data/bad_lines.jsonl) and metrics/prepare.json. With data.regenerate, every trained assistant turn is the target's
own greedy answer, token for token."""

from __future__ import annotations

import logging

from eagle3_pipeline.core.errors import StageError
from eagle3_pipeline.core.io import remove_path
from eagle3_pipeline.core.metrics import details_path, headline_path, write_stage_metrics
from eagle3_pipeline.data.bad_input import StageInputError
from eagle3_pipeline.data.prepare import bad_lines_path, heldout_path, prepare, prepared_dir
from eagle3_pipeline.data.record import PrepareRecord
from eagle3_pipeline.data.regenerate.server import ServerUnavailable
from eagle3_pipeline.data.view import PrepareInputs
from eagle3_pipeline.stages.runner import run_stage

log = logging.getLogger(__name__)

INPUTS = PrepareInputs


def run(cfg: PrepareInputs, progress: bool = True) -> None:
    stale_outputs = (
        prepared_dir(cfg),
        heldout_path(cfg),
        bad_lines_path(cfg),
        details_path(cfg, "prepare"),
        headline_path(cfg, PrepareRecord),
    )
    for stale in stale_outputs:
        remove_path(stale)
    try:
        record = prepare(cfg, progress)
    except StageInputError as exc:
        raise StageError(str(exc)) from None
    except ServerUnavailable as exc:
        raise StageError(f"regeneration: {exc}") from None
    write_stage_metrics(cfg, record)
    log.info(
        "prepared %d rows from %d training conversations (%d held out); %d tokens, %d "
        "supervised; dropped %s; errors %s",
        record.rows,
        record.conversations_train,
        record.conversations_heldout,
        record.tokens,
        record.supervised_tokens,
        record.rows_dropped,
        record.errors,
    )
    log.info(
        "training set sha256 %s, held-out set sha256 %s; data licence: %s%s",
        record.train_sha256,
        record.heldout_sha256,
        record.license,
        f"; pinned {record.pinned}" if record.pinned else "",
    )
    if record.truncated_tail:
        log.warning(
            "the data file is truncated: its last record (from byte %s, %s bytes) was cut "
            "and is not used (truncated_tail in %s)",
            record.truncated_tail_offset,
            record.truncated_tail_bytes,
            details_path(cfg, "prepare"),
        )


def main(argv: list[str] | None = None) -> None:
    run_stage("prepare", __doc__ or "", INPUTS.from_config, run, argv)


if __name__ == "__main__":
    main()
