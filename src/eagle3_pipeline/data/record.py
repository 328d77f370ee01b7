"""``metrics/details/prepare.json``: what the prepare stage made of the data.

Read back by the plan (:func:`eagle3_pipeline.plan.resources.estimate_storage`): the
measured tokens per row and rows per conversation replace the ``data.max_seq_len`` upper
bound in the hidden-state storage estimate. (:mod:`.source_size` is another thing: counting
the source's records before any tokenizer runs.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eagle3_pipeline.runtime.precision import Precision
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
    # the target's precision in regeneration and why (model.dtype, else preflight's
    # choice); None without regeneration
    precision: Precision | None = optional()
    reasoning: str  # data.reasoning
    regeneration: Regeneration | None = optional()  # its counts, None without regeneration
    wall_s: float  # the stage's own time
    # What the draft was trained on (fields with defaults: earlier files stay readable).
    roles: str = "any"  # data.roles: the role rule applied
    # turns cut from conversations that were used, per reason (data.roles=eagle)
    turns_dropped: dict[str, int] = field(default_factory=dict)
    # 1 when the data file ends inside a record (a JSON array published cut): that record
    # is skipped and counted in errors (truncated_tail), never silently dropped
    truncated_tail: int = 0
    truncated_tail_offset: int | None = optional()  # the cut record's first byte
    truncated_tail_bytes: int | None = optional()  # the bytes left unread after it
    # SHA-256 of the training / held-out conversations' content (see
    # data.conversation.conversation_set_sha256): which conversations, not just how many
    train_sha256: str | None = optional()
    heldout_sha256: str | None = optional()
    license: str | None = optional()  # data.license, as the data's publisher states it
    data_sha256: str | None = optional()  # the data file's SHA-256 (data.source=file)
    pinned: str | None = optional()  # package==version of a pinned data file
    # per assistant turn (0 = each conversation's first answer): rows and mean tokens of
    # context and of answer before truncation (TurnTokens), regenerated or recorded
    turns: list[TurnTokens] | None = optional()


@dataclass(frozen=True)
class TurnTokens:
    """Token counts of one assistant-turn position over the training rows: how long
    contexts grow with the target's own earlier answers in them, and how long it answers."""

    turn: int  # 0 = the first answer of each conversation
    rows: int  # training rows with an answer at this position
    mean_prompt_tokens: float  # the context before the answer
    mean_completion_tokens: float  # the answer, before truncation
    max_prompt_tokens: int  # the longest context


@dataclass(frozen=True)
class Regeneration:
    """What on-policy regeneration did (``data.regenerate``): requests, cache hits and
    what the target answered."""

    requests: int  # generation requests sent to the backend (one per turn not cached)
    cached: int  # turns answered from the cache of an earlier run
    generated_tokens: int  # tokens the target generated
    unfinished_turns: int  # answers cut at data.max_new_tokens before the end-of-turn token
    # generations the backend conditioned on other ids than our render of the same messages
    # (a server with another chat template): its ids were used
    prompt_mismatch: int
    failed_requests: int  # requests that failed (per kind in the record's errors)
    wall_s: float  # the regeneration's own time
