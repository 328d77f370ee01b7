"""Hidden-state extraction's test fixtures: a work directory with prepared rows next to a
built tiny target, its composed config, and one extraction over it. Shared by the
extract stage's tests and the real-vLLM extraction tests."""

from __future__ import annotations

import os
from pathlib import Path

from eagle3_pipeline.core.config import load_config
from eagle3_pipeline.extract.hf_backend import extract_hf
from eagle3_pipeline.extract.record import ExtractRecord

REPO = Path(__file__).resolve().parents[2]
ROW_TOKENS = 40  # short rows keep the CPU forwards fast


def make_rows(workdir: Path, n: int, max_len: int = ROW_TOKENS, offset: int = 0) -> Path:
    """Prepared rows (input_ids, loss_mask, seq_len; torch format, as speculators saves
    them) tokenized by the target's own tokenizer from the built-in corpus."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from eagle3_pipeline.core.corpus import builtin_conversations

    tok = AutoTokenizer.from_pretrained(workdir / "data/target/model")
    convs = builtin_conversations(0)[offset : offset + n]
    cols: dict[str, list] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    for k, c in enumerate(convs):
        text = tok.apply_chat_template(c["messages"], tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"][: max_len - 5 * (k % 5)]
        cols["input_ids"].append(ids)
        cols["loss_mask"].append([0] * (len(ids) // 2) + [1] * (len(ids) - len(ids) // 2))
        cols["seq_len"].append(len(ids))
    ds = Dataset.from_dict(cols)
    ds.set_format("torch")
    out = workdir / "data/prepared"
    if out.exists():
        import shutil

        shutil.rmtree(out)
    ds.save_to_disk(str(out))
    return out


def workdir_for(target_root: Path, tmp: Path, n: int = 8) -> Path:
    (tmp / "data").mkdir(parents=True)
    (tmp / "data/target").symlink_to(target_root / "data/target")
    make_rows(tmp, n)
    return tmp


def config(workdir: Path, *overrides: str, model: str = "tiny_kimi_k25"):
    old = os.getcwd()
    os.chdir(workdir)
    try:
        return load_config(
            [f"model={model}", "extract.batch_tokens=96", "extract.fsync=false", *overrides],
            conf_dir=REPO / "conf",
        )
    finally:
        os.chdir(old)


def extract(workdir: Path, *overrides: str, model: str = "tiny_kimi_k25") -> ExtractRecord:
    cfg = config(workdir, *overrides, model=model)
    old = os.getcwd()
    os.chdir(workdir)
    try:
        return extract_hf(cfg, progress=False)
    finally:
        os.chdir(old)


def rows_of(workdir: Path) -> list[list[int]]:
    from datasets import load_from_disk

    return [list(map(int, r)) for r in load_from_disk(str(workdir / "data/prepared"))["input_ids"]]
