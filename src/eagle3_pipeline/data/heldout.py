"""Held-out prompts for validation (data/heldout/prompts.jsonl): one record per held-out
conversation, its first prompt rendered to token ids by the target's chat template."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from eagle3_pipeline.data.conversation import Conversation
from eagle3_pipeline.targets.chat import render_ids


def heldout_records(convs: Iterable[Conversation], tokenizer: Any) -> list[dict[str, Any]]:
    """One record per held-out conversation: the context through the first user turn,
    its generation-prompt token ids, and the recorded answer to it (empty when the
    conversation has none)."""
    out = []
    for c in convs:
        context = c.prompt()
        after = c.messages[c.first_user() + 1 :]
        answer = next((m for m in after if m.role == "assistant"), None)
        out.append(
            {
                "id": c.id,
                "messages": context,
                "prompt_ids": render_ids(tokenizer, context, generation_prompt=True),
                "reference": answer.content if answer else "",
                "reference_reasoning": (answer.reasoning_content or "") if answer else "",
            }
        )
    return out


def heldout_jsonl(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records)
