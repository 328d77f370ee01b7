"""Stage `target`: build the embedded tiny target, or describe a real one (never its
weights), into data/target/target.json -- the one place later stages read the target's
shape and the aux layer ids from."""

from __future__ import annotations

import logging

from eagle3_pipeline.core.metrics import write_details
from eagle3_pipeline.stages.runner import run_stage
from eagle3_pipeline.targets.resolve import resolve_target
from eagle3_pipeline.targets.view import TargetInputs

log = logging.getLogger(__name__)

INPUTS = TargetInputs


def run(inputs: TargetInputs) -> None:
    spec, record = resolve_target(inputs)
    write_details(inputs, record)
    log.info(
        "target %s (%s -> vLLM %s): %d layers, hidden %d, vocab %d, aux layers %s",
        spec.name,
        spec.architecture,
        spec.vllm_architecture,
        spec.num_layers,
        spec.hidden_size,
        spec.vocab_size,
        spec.aux_layer_ids,
    )
    if record.heldout_perplexity is not None:
        log.info(
            "tiny target held-out perplexity %.1f (unigram %.1f, ratio %.2f)",
            record.heldout_perplexity,
            record.unigram_perplexity,
            record.perplexity_ratio_vs_unigram,
        )


def main(argv: list[str] | None = None) -> None:
    run_stage("target", __doc__ or "", INPUTS.from_config, run, argv)


if __name__ == "__main__":
    main()
