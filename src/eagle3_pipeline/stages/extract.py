"""Stage `extract`: the target's hidden states for every prepared row, in speculators'
file format (data/hidden_states/hs_{i}.safetensors + manifest.json), with the `hf`
backend (transformers, CPU or GPU) or the `vllm` backend (a vLLM server, GPU). With
extract.mode=online it writes only manifest.json: the train stage then serves the target
in vLLM and reads the hidden states batch by batch, storing none."""

from __future__ import annotations

import logging

from eagle3_pipeline.core.metrics import write_details
from eagle3_pipeline.extract.view import ExtractInputs
from eagle3_pipeline.stages.runner import run_stage

log = logging.getLogger(__name__)

INPUTS = ExtractInputs


def run(cfg: ExtractInputs) -> None:
    if cfg.extract.mode == "online":
        from eagle3_pipeline.extract.online import record_online

        record = record_online(cfg)
        write_details(cfg, record)
        log.info(
            "extract (online): manifest for %d rows (%d tokens), layers %s; the train "
            "stage serves the target and reads their hidden states from vLLM",
            record.samples,
            record.tokens,
            record.aux_layer_ids,
        )
        return
    if cfg.extract.backend == "vllm":
        from eagle3_pipeline.extract.vllm_backend import extract_vllm

        record = extract_vllm(cfg)
    else:
        from eagle3_pipeline.extract.hf_backend import extract_hf

        record = extract_hf(cfg)
    name = "extract" if cfg.extract.world_size == 1 else f"extract.rank{cfg.extract.rank}"
    write_details(cfg, record, name)
    log.info(
        "extract (%s): %d samples, %d written, %d reused; %.0f tokens/s; %.1f MB written "
        "(%.0f B/token); layers %s",
        record.backend,
        record.samples,
        record.samples_written,
        record.samples_reused,
        record.tokens_per_s,
        record.bytes_written / 1e6,
        record.bytes_per_token,
        record.aux_layer_ids,
    )


def main(argv: list[str] | None = None) -> None:
    run_stage("extract", __doc__ or "", INPUTS.from_config, run, argv)


if __name__ == "__main__":
    main()
