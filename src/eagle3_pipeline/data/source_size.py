"""How many conversations the configured data source holds, read without a tokenizer.

Why: the disk and time estimates scale with the number of conversations trained on. That
is ``train.samples`` only when the source has that many; a 9-line file trains on at most
9 minus the held-out ones, and an estimate from ``train.samples`` alone would demand
hundreds of GB for it. Counting is cheap (one read of the file, no JSON parsing of JSONL
lines), so preflight and the plan can afford it; a Hugging Face dataset is not counted
(it may be remote), and the estimate then says it assumes ``train.samples``.
"""

from __future__ import annotations

import json
import mmap
from pathlib import Path

from eagle3_pipeline.core.config import DataConfig
from eagle3_pipeline.data.json_records import (
    document_records,
    first_byte,
    is_json_document,
    json_array_spans,
)


def count_records(data: DataConfig, seed: int) -> int | None:
    """Records in the source (an upper bound on usable conversations), or None when
    unknown: a Hugging Face dataset, or a file that cannot be read (the prepare stage
    reports that one)."""
    if data.source == "builtin":
        from eagle3_pipeline.core.corpus import builtin_conversations

        return len(builtin_conversations(seed))
    if data.source != "file" or not data.path:
        return None
    path = Path(str(data.path))
    try:
        if is_json_document(path):
            if first_byte(path) != b"[":  # an object holding a list: small, parsed whole
                try:
                    doc = document_records(json.loads(path.read_bytes()))
                except (ValueError, UnicodeDecodeError):
                    return 0
                return len(doc) if isinstance(doc, list) else 0
            # an array: its complete records (a truncated tail is not one), not parsed
            with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return sum(1 for _ in json_array_spans(buf, None, path))
        with open(path, "rb") as fh:
            return sum(1 for line in fh if line.strip())
    except OSError:
        return None


def selectable_samples(data: DataConfig, samples: int, seed: int) -> tuple[int, str]:
    """Conversations the train stage can get: ``min(train.samples, records - held out)``,
    and a phrase saying which bound applied."""
    n = count_records(data, seed)
    if n is None:
        return samples, f"train.samples={samples} (the source is not counted ahead)"
    available = max(n - data.heldout_size, 0)
    if available < samples:
        return available, (
            f"{available} conversations: {n} records in the data less "
            f"data.heldout_size={data.heldout_size} (train.samples={samples} is more)"
        )
    return samples, f"train.samples={samples} of {available} available"
