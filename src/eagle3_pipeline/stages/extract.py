"""Stage `extract`: the target's hidden states for every prepared row, in speculators'
file format (data/hidden_states/hs_{i}.safetensors + manifest.json), with the `hf`
backend (transformers, CPU or GPU) or the `vllm` backend (a vLLM server, GPU). With
extract.mode=online it writes only manifest.json: the train stage then serves the target
in vLLM and reads the hidden states batch by batch, storing none."""

from __future__ import annotations

import logging

from eagle3_pipeline.core.config import Config
from eagle3_pipeline.core.metrics import write_stage_metrics
from eagle3_pipeline.stages.runner import run_stage

log = logging.getLogger(__name__)


def run(cfg: Config) -> None:
    if cfg.extract.mode == "online":
        from eagle3_pipeline.extract.online import record_online

        metrics = record_online(cfg)
        write_stage_metrics(cfg, "extract", metrics)
        log.info("extract (online): manifest for %d rows (%d tokens), layers %s; the train "
                 "stage serves the target and reads their hidden states from vLLM",
                 metrics["samples"], metrics["tokens"], metrics["aux_layer_ids"])
        return
    if cfg.extract.backend == "vllm":
        from eagle3_pipeline.extract.vllm_backend import extract_vllm

        metrics = extract_vllm(cfg)
    else:
        from eagle3_pipeline.extract.hf_backend import extract_hf

        metrics = extract_hf(cfg)
    name = "extract" if cfg.extract.world_size == 1 else f"extract.rank{cfg.extract.rank}"
    write_stage_metrics(cfg, name, metrics)
    log.info(
        "extract (%s): %d samples, %d written, %d reused; %.0f tokens/s; %.1f MB written "
        "(%.0f B/token); layers %s",
        metrics["backend"], metrics["samples"], metrics["samples_written"],
        metrics["samples_reused"], metrics["tokens_per_s"], metrics["bytes_written"] / 1e6,
        metrics["bytes_per_token"], metrics["aux_layer_ids"],
    )


def main(argv: list[str] | None = None) -> None:
    run_stage("extract", __doc__ or "", run, argv)


if __name__ == "__main__":
    main()
