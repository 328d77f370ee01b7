"""The target's chat rendering, as vLLM's chat endpoint does it.

Why one function shared by training and validation: a draft is trained on the token ids
the target sees at serve time, and it is measured on prompts rendered the same way; two
renderings that differ by one token (a BOS added twice, a default system prompt) make
the figures say nothing about serving.
"""

from __future__ import annotations

from typing import Any


def render_ids(
    tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool
) -> list[int]:
    """Token ids of the chat template's rendering, tokenized the way vLLM's chat endpoint
    does (render to text, then encode without adding special tokens again)."""
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def answer_text(tokenizer: Any, ids: list[int], stop_ids: set[int]) -> str:
    """An assistant turn's content as vLLM's chat endpoint returns it: the generated ids
    without the stop token that ended them, decoded without special tokens."""
    while ids and ids[-1] in stop_ids:
        ids = ids[:-1]
    return str(tokenizer.decode(ids, skip_special_tokens=True))
