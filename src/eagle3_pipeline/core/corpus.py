"""The built-in corpus: chat conversations made from ``pydoc_data.topics``.

Why this text: it ships with every CPython install (no download), it is about 1,100
paragraphs of real English prose, and its licence is clear -- the Python Software
Foundation License (PSF-2.0), like the documentation it comes from.

Each conversation is a user question about one reference topic and the paragraph as the
assistant's answer. Some carry a short reasoning block (``reasoning_content``) and some
continue with a follow-up turn, so that masking, the reasoning-dropping chat template and
multi-turn handling are all exercised by the default run, not only by unit tests.
"""

from __future__ import annotations

import random
import re
from typing import Any

LICENSE = "PSF-2.0 (Python Software Foundation License), text from pydoc_data.topics"

_QUESTIONS = (
    "What does the Python reference say about {t}?",
    "Can you explain {t} in Python?",
    "How does {t} work in Python?",
    "Tell me about {t}.",
    "I am reading about {t}. What should I know?",
    "Explain the rules for {t}.",
)
_FOLLOW_UPS = ("Tell me more.", "What else is there?", "Go on, please.", "And then?")
_REASONING = (
    "The user asks about {t}. I will answer from the reference section on {t}.",
    "This is a question about {t} in Python. The reference manual covers it.",
    "They want to know about {t}. I should explain it plainly.",
)


def _clean(paragraph: str) -> str:
    return re.sub(r"\s+", " ", paragraph).strip()


def topic_paragraphs(min_words: int = 20) -> list[tuple[str, list[str]]]:
    """(topic, paragraphs of more than ``min_words`` words), in a stable order."""
    from pydoc_data.topics import topics

    out = []
    for name in sorted(topics):
        paras = [_clean(p) for p in re.split(r"\n\s*\n", topics[name])]
        paras = [p for p in paras if len(p.split()) > min_words]
        if paras:
            out.append((name.replace("-", " "), paras))
    return out


def builtin_conversations(seed: int = 0) -> list[dict[str, Any]]:
    """Conversations in OpenAI form (``messages: [{role, content, reasoning_content?}]``).

    Deterministic for a given seed; the order is topic-major, so callers shuffle with
    their own seed when they split.
    """
    rng = random.Random(seed)
    convs: list[dict[str, Any]] = []
    for topic, paras in topic_paragraphs():
        i = 0
        while i < len(paras):
            q = rng.choice(_QUESTIONS).format(t=topic)
            answer: dict[str, Any] = {"role": "assistant", "content": paras[i]}
            if rng.random() < 0.5:
                answer["reasoning_content"] = rng.choice(_REASONING).format(t=topic)
            messages = [{"role": "user", "content": q}, answer]
            i += 1
            # every fourth conversation continues with a follow-up turn on the same topic
            if i < len(paras) and rng.random() < 0.25:
                follow: dict[str, Any] = {"role": "assistant", "content": paras[i]}
                if rng.random() < 0.5:
                    follow["reasoning_content"] = f"They want more about {topic}."
                messages += [{"role": "user", "content": rng.choice(_FOLLOW_UPS)}, follow]
                i += 1
            convs.append({"id": f"pydoc-{len(convs):05d}", "topic": topic, "messages": messages})
    return convs
