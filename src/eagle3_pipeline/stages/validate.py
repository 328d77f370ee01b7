"""Stage `validate`: will vLLM load the draft correctly, is it lossless, and how
many tokens per target step does it really buy?

Reads data/draft (the train stage's checkpoint), data/target/target.json, the held-out
prompts data/heldout/prompts.jsonl; writes dvclive/validate/ (the summary DVC shows,
per-position acceptance, acceptance.png), metrics/details/validate.json (every figure)
and data/validate/ (report.md, acceptance.png, README.md: the model card). Fails when the
checkpoint validator finds errors, or when float32 speculative decoding is not lossless.
"""

from __future__ import annotations

import logging

from eagle3_pipeline.core.io import atomic_dir, remove_path
from eagle3_pipeline.core.metrics import write_details
from eagle3_pipeline.stages.runner import run_stage
from eagle3_pipeline.validate.live import write_live
from eagle3_pipeline.validate.report import validation_files
from eagle3_pipeline.validate.run import ValidatePaths, validate_draft
from eagle3_pipeline.validate.view import ValidateInputs

log = logging.getLogger(__name__)

INPUTS = ValidateInputs


def run(cfg: ValidateInputs) -> None:
    p = ValidatePaths.from_config(cfg)
    device, dtype = cfg.runtime()  # a config error leaves the last outputs in place
    for stale in (p.metrics, p.out):
        remove_path(stale)
    record, facts = validate_draft(cfg, device, dtype)
    files = validation_files(record, facts)
    with atomic_dir(p.out) as tmp:
        for name, content in files.items():
            (tmp / name).write_bytes(content)
    write_details(cfg, record)
    write_live(p.live, record, files["acceptance.png"])
    log.info(
        "acceptance length %.3f at K=%d (%d prompts, %d tokens, %d steps); lossless: %s",
        record.acceptance_length or 0.0,
        record.k,
        record.ours.prompts,
        record.ours.tokens,
        record.ours.steps,
        record.lossless,
    )


def main(argv: list[str] | None = None) -> None:
    run_stage("validate", __doc__ or "", INPUTS.from_config, run, argv)


if __name__ == "__main__":
    main()
