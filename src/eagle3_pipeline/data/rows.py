"""Conversations -> speculators training rows (``input_ids``, ``loss_mask``, ``seq_len``).

Rows are built the way speculators' own preprocessing builds them (one row per assistant
turn; the context is the conversation before that turn rendered by the target's chat
template WITH the generation prompt, so past reasoning is dropped exactly as the target
sees it at inference), with two deliberate differences:

- we render locally with the target's tokenizer instead of a vLLM ``/render`` endpoint,
  because the default run has no server; the boundary rule is the same: the full render
  of ``conv[:j+1]`` must extend the generation-prompt render of ``conv[:j]``, else the
  row is a ``prefix_unstable`` error (speculators tries a common-prefix fallback; a
  template that diverges there re-renders reasoning differently from inference, and we
  would rather count it than train on a boundary we cannot explain);
- supervision stops at the turn's end-of-turn token: whatever a template renders after
  it (Qwen's ``\\n``) is never generated at inference, so it is cut, not supervised.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config import ConfigError
from eagle3_pipeline.data.conversation import Conversation, Message
from eagle3_pipeline.data.record import TurnTokens
from eagle3_pipeline.targets.chat import render_ids  # shared with validation

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- tokenizer


def load_tokenizer(model_dir: str | Path, trust_remote_code: bool = False) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    if not getattr(tok, "chat_template", None):
        raise ConfigError(f"{model_dir}: the target's tokenizer has no chat template")
    return tok


def end_of_turn_ids(tokenizer: Any, model_dir: str | Path) -> list[int]:
    """The ids that end an assistant turn: generation_config's ``eos_token_id`` (what the
    target stops on when served; Kimi's ``<|im_end|>``) plus the tokenizer's eos."""
    ids: list[int] = []
    gen = Path(model_dir) / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text(encoding="utf-8")).get("eos_token_id")
        ids += eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    if not ids:
        raise ConfigError(f"{model_dir}: no eos_token_id in generation_config.json or tokenizer")
    return list(dict.fromkeys(ids))


# --------------------------------------------------------------------------- rows


class RowError(ValueError):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def assistant_turn_ids(
    tokenizer: Any, context: Sequence[Message], turn: Message, eot_ids: list[int]
) -> tuple[list[int], list[int]]:
    """(context ids, turn ids) for one recorded assistant turn: the context is the
    generation-prompt render of ``context``; the turn runs through its end-of-turn token.

    Raises :class:`RowError` (``prefix_unstable``, ``no_end_of_turn``).
    """
    history = [m.chat() for m in context]
    prompt = render_ids(tokenizer, history, generation_prompt=True)
    full = render_ids(tokenizer, [*history, turn.chat()], generation_prompt=False)
    if full[: len(prompt)] != prompt:
        at = next(
            (i for i, (a, b) in enumerate(zip(prompt, full, strict=False)) if a != b),
            min(len(prompt), len(full)),
        )
        raise RowError(
            "prefix_unstable",
            f"the chat template is not prefix-stable here: the render with this turn "
            f"differs from the generation-prompt render at token {at}",
        )
    completion = full[len(prompt) :]
    ends = [i for i, t in enumerate(completion) if t in eot_ids]
    if not ends:
        raise RowError("no_end_of_turn", "the rendered assistant turn has no end-of-turn token")
    return prompt, completion[: ends[-1] + 1]


@dataclass
class Row:
    """One training row before truncation: the context ids, then the supervised ids."""

    conversation: str
    turn: int  # recorded rows: the turn's index in the messages; regenerated: == answer
    context: list[int]
    completion: list[int]
    answer: int = 0  # which assistant turn of its conversation (0: the first answer)


def turn_tokens(rows: Iterable[Row]) -> list[TurnTokens]:
    """Per assistant-turn position: rows, mean context and answer tokens (before
    truncation). Multi-turn data shows here: later turns' contexts carry earlier answers."""
    by_turn: dict[int, list[Row]] = {}
    for r in rows:
        by_turn.setdefault(r.answer, []).append(r)
    return [
        TurnTokens(
            turn=k,
            rows=len(rs),
            mean_prompt_tokens=round(sum(len(r.context) for r in rs) / len(rs), 1),
            mean_completion_tokens=round(sum(len(r.completion) for r in rs) / len(rs), 1),
            max_prompt_tokens=max(len(r.context) for r in rs),
        )
        for k, rs in sorted(by_turn.items())
    ]


def recorded_rows(
    conv: Conversation, tokenizer: Any, eot_ids: list[int], reasoning: str
) -> tuple[list[Row], Counter[str]]:
    """Rows for a conversation's recorded assistant turns (no regeneration)."""
    rows: list[Row] = []
    errors: Counter[str] = Counter()
    msgs = conv.messages
    answer = -1
    for j, m in enumerate(msgs):
        if m.role != "assistant" or not any(p.role == "user" for p in msgs[:j]):
            continue
        answer += 1
        turn = m if reasoning == "keep" else m.without_reasoning()
        try:
            ctx, comp = assistant_turn_ids(tokenizer, msgs[:j], turn, eot_ids)
        except RowError as exc:
            errors[exc.reason] += 1
            log.debug("%s turn %d: %s", conv.id, j, exc)
            continue
        rows.append(Row(conv.id, j, ctx, comp, answer))
    return rows, errors


def finalize_rows(
    rows: Iterable[Row], max_seq_len: int
) -> tuple[list[dict[str, list[int]]], Counter[str], int]:
    """Truncate to ``max_seq_len`` and build ``input_ids`` / ``loss_mask``; a row with no
    supervised token left is dropped (``no_supervised_tokens``). Returns (rows, dropped,
    number of kept rows that were truncated)."""
    out: list[dict[str, list[int]]] = []
    dropped: Counter[str] = Counter()
    truncated = 0
    for r in rows:
        ids = (r.context + r.completion)[:max_seq_len]
        mask = ([0] * len(r.context) + [1] * len(r.completion))[:max_seq_len]
        if not any(mask):
            dropped["no_supervised_tokens"] += 1
            continue
        truncated += len(r.context) + len(r.completion) > max_seq_len
        out.append({"input_ids": ids, "loss_mask": mask})
    return out, dropped, truncated


def token_frequencies(rows: Iterable[dict[str, list[int]]]) -> dict[int, int]:
    """Counts of supervised tokens (what speculators' ``save_token_frequency_distribution``
    computes), sorted by id so the file is byte-stable."""
    freq: Counter[int] = Counter()
    for r in rows:
        freq.update(t for t, m in zip(r["input_ids"], r["loss_mask"], strict=True) if m)
    return dict(sorted(freq.items()))


def write_prepared(rows: list[dict[str, list[int]]], out_dir: Path) -> dict[int, int]:
    """Write the dataset (speculators' columns, int64, torch format as its own
    preprocessing saves it) and ``token_freq.pt`` into ``out_dir`` atomically."""
    import torch
    from datasets import Dataset, Features, Sequence, Value

    from eagle3_pipeline.core.io import atomic_dir

    features = Features(
        {
            "input_ids": Sequence(Value("int64")),
            "loss_mask": Sequence(Value("int64")),
            "seq_len": Value("int64"),
        }
    )
    ds = Dataset.from_dict(
        {
            "input_ids": [r["input_ids"] for r in rows],
            "loss_mask": [r["loss_mask"] for r in rows],
            "seq_len": [len(r["input_ids"]) for r in rows],
        },
        features=features,
    )
    ds.set_format(type="torch")
    freq = token_frequencies(rows)
    with atomic_dir(out_dir) as tmp:
        ds.save_to_disk(str(tmp))
        torch.save(freq, tmp / "token_freq.pt")
    return freq
