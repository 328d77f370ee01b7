"""``metrics/details/prepare.json``: what the prepare stage made of the data.

Read back by the plan (:func:`eagle3_pipeline.plan.resources.estimate_storage`): the
measured tokens per row and rows per conversation replace the ``data.max_seq_len`` upper
bound in the hidden-state storage estimate. (:mod:`.records` is another thing: counting
the source's records before any tokenizer runs.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eagle3_pipeline.core.records import Record, headline, optional


@dataclass(kw_only=True)
class PrepareRecord(Record):
    STAGE = "prepare"

    source: str  # data.source
    conversations_in: int  # records read from the source
    conversations_invalid: int  # of them refused (bad_lines.jsonl)
    conversations_heldout: int  # kept for validation (data.heldout_size)
    conversations_train: int  # trained on
    rows: int = headline()  # training rows written (a conversation may yield several)
    rows_dropped: dict[str, int]  # rows not written, per reason
    rows_truncated: int  # rows cut to data.max_seq_len
    errors: dict[str, int]  # bad records and failed requests, per kind
    tokens: int  # tokens over all rows
    supervised_tokens: int  # of them with loss (the assistant's)
    mean_tokens_per_row: float  # what the plan's storage estimate scales with
    max_tokens_per_row: int  # the longest row
    max_seq_len: int  # data.max_seq_len
    regenerate: bool  # data.regenerate: assistant turns are the target's own answers
    backend: str | None  # data.regenerate_backend, None without regeneration
    reasoning: str  # data.reasoning
    regeneration: dict[str, Any] | None = optional()  # the regeneration's counts and cache
    wall_s: float  # the stage's own time
