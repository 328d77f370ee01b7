"""Benchmark of the `extract` stage's hf backend on CPU.

A random-weight Llama target of hidden size 512 is built in-process (a 128-wide tiny
target's file writes dominate everything), with random rows of 64-256 tokens. In one run,
over the same batches, it reports:

- the stage (``extract_hf``): tokens/s and its time split into forward, capture,
  serialization and fsync (serialization + fsync run in the writer thread, overlapped);
- a bare decoder forward (what the stage must run) and a bare ``model(...)`` (+ lm_head);
- a bare serialization (save_file + fsync + rename) of tensors of the same shapes;

and the ratio of the stage's throughput to the slower of the bare forward and the bare
serialization (goal: >= 0.85, since writing overlaps computing).

Usage: python bench/extract.py [--rows 64] [--hidden 512] [--layers 4] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch


def build_target(root: Path, hidden: int, layers: int, vocab: int) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    from eagle3_pipeline.core.config import ModelConfig
    from eagle3_pipeline.core.corpus import builtin_conversations
    from eagle3_pipeline.targets.adapter import describe_target
    from eagle3_pipeline.targets.tiny import build_tokenizer

    texts = [m["content"] for c in builtin_conversations(0) for m in c["messages"]]
    tok = build_tokenizer(texts, vocab)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 128,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    model_dir = root / "data/target/model"
    LlamaForCausalLM(cfg).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    spec = describe_target(
        model_dir, ModelConfig(name=f"bench_llama_h{hidden}", path=str(model_dir))
    )
    (root / "data/target/target.json").write_text(json.dumps(spec.to_dict(), indent=2))
    return model_dir


def build_rows(root: Path, n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    from datasets import Dataset

    rng = random.Random(seed)
    rows = [[rng.randrange(16, vocab) for _ in range(rng.randint(64, 256))] for _ in range(n)]
    ds = Dataset.from_dict(
        {
            "input_ids": rows,
            "loss_mask": [[1] * len(r) for r in rows],
            "seq_len": [len(r) for r in rows],
        }
    )
    ds.set_format("torch")
    ds.save_to_disk(str(root / "data/prepared"))
    return rows


def bare_forward(lm, rows, plan, full: bool) -> float:
    from eagle3_pipeline.targets.capture import forward_batch

    t0 = time.perf_counter()
    with torch.inference_mode():
        for batch in plan:
            seqs = [rows[i] for i in batch]
            if full:
                longest = max(len(s) for s in seqs)
                ids = torch.zeros(len(seqs), longest, dtype=torch.long)
                mask = torch.zeros_like(ids)
                for b, s in enumerate(seqs):
                    ids[b, : len(s)] = torch.tensor(s)
                    mask[b, : len(s)] = 1
                lm.model(input_ids=ids, attention_mask=mask, use_cache=False)
            else:
                forward_batch(lm, seqs, 0)
    return time.perf_counter() - t0


def bare_serialize(rows, n_layers: int, hidden: int, fsync: bool) -> tuple[float, int]:
    from eagle3_pipeline.extract.writer import save_hidden_states

    tensors = [
        (
            torch.tensor(r, dtype=torch.int64),
            torch.randn(len(r), n_layers, hidden).to(torch.bfloat16),
        )
        for r in rows
    ]
    out = Path(tempfile.mkdtemp(prefix="bench_ser_"))
    try:
        t0 = time.perf_counter()
        size = 0
        for i, (tok, hs) in enumerate(tensors):
            size += save_hidden_states(out / f"hs_{i}.safetensors", tok, hs, fsync)
        return time.perf_counter() - t0, size
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--out", help="also write the figures to this JSON file")
    args = ap.parse_args()

    from eagle3_pipeline.core.config import load_config
    from eagle3_pipeline.extract.batch_plan import plan_batches
    from eagle3_pipeline.extract.hf_backend import extract_hf
    from eagle3_pipeline.extract.view import ExtractInputs
    from eagle3_pipeline.targets.adapter import load_target_spec
    from eagle3_pipeline.targets.loading import load_language_model

    repo = Path(__file__).resolve().parents[1]
    root = Path(tempfile.mkdtemp(prefix="bench_extract_"))
    try:
        build_target(root, args.hidden, args.layers, args.vocab)
        rows = build_rows(root, args.rows, args.vocab)
        spec = load_target_spec(root / "data/target/target.json")
        cfg = load_config(
            [
                "model=tiny_llama",
                f"data_dir={root / 'data'}",
                f"metrics_dir={root / 'metrics'}",
                f"extract.batch_tokens={args.batch_tokens}",
            ],
            conf_dir=repo / "conf",
        )
        cfg.model.aux_layer_ids = None
        tokens = sum(len(r) for r in rows)
        plan = plan_batches([len(r) for r in rows], args.batch_tokens, cfg.extract.plan_rows)

        lm = load_language_model(spec, Path(spec.path or ""), "float32")
        bare_forward(lm, rows, plan[:1], full=False)  # warm-up
        fwd_s = bare_forward(lm, rows, plan, full=False)
        full_s = bare_forward(lm, rows, plan, full=True)
        n_layers = len(spec.aux_layer_ids) + 1
        ser_s, ser_bytes = bare_serialize(rows, n_layers, spec.hidden_size, fsync=True)
        del lm

        m = extract_hf(ExtractInputs.from_config(cfg), progress=False)
        stage_tps = m.tokens_per_s
        bare = {"forward": tokens / fwd_s, "serialize": tokens / ser_s}
        slower = min(bare.values())
        figures = {
            "target": spec.name,
            "hidden_size": spec.hidden_size,
            "layers": spec.num_layers,
            "aux_layer_ids": spec.aux_layer_ids,
            "rows": len(rows),
            "tokens": tokens,
            "batches": len(plan),
            "batch_tokens": args.batch_tokens,
            "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "stage_tokens_per_s": stage_tps,
            "stage_split_s": {
                k: getattr(m, k)
                for k in (
                    "forward_s",
                    "capture_s",
                    "serialize_s",
                    "fsync_s",
                    "queue_wait_s",
                    "compute_wall_s",
                )
            },
            "bare_forward_tokens_per_s": bare["forward"],
            "bare_model_call_tokens_per_s": tokens / full_s,
            "bare_serialize_tokens_per_s": bare["serialize"],
            "bare_serialize_bytes": ser_bytes,
            "stage_bytes_per_token": m.bytes_per_token,
            "ratio_stage_vs_slower_bare": stage_tps / slower,
            "ratio_stage_vs_bare_forward": stage_tps / bare["forward"],
            "ratio_stage_vs_bare_model_call": stage_tps / (tokens / full_s),
            "peak_rss_bytes": m.peak_rss_bytes,
        }
        print(json.dumps(figures, indent=2))
        print(
            f"\nstage {stage_tps:,.0f} tok/s | bare forward {bare['forward']:,.0f} | bare model() "
            f"{tokens / full_s:,.0f} | bare serialize {bare['serialize']:,.0f} tok/s\n"
            f"stage / slower bare = {stage_tps / slower:.2f} (goal >= 0.85)",
            file=sys.stderr,
        )
        if args.out:
            Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
