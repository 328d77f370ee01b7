"""A conversation is a typed object: what normalising a record gives, the chat-template
messages it hands a tokenizer, and the content hash that names a set of them."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace

import pytest

from eagle3_pipeline.data.conversation import (
    Conversation,
    Message,
    conversation_set_sha256,
    normalize_record,
)

RECORDS = [
    {
        "id": "a",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Héllo?"},
            {"role": "assistant", "content": "Hi.", "reasoning_content": "Greet back."},
        ],
    },
    {
        "id": 7,
        "conversations": [
            {"from": "human", "value": "2+2?"},
            {"from": "gpt", "value": "4"},
            {"from": "human", "value": "and 3+3?"},
            {"from": "gpt", "value": "6", "thinking": ""},
        ],
    },
    {
        "messages": [
            {"role": "user", "content": 'no id "quoted" \u2603'},
            {"role": "assistant", "content": "ok"},
        ]
    },
]


def _convs() -> list[Conversation]:
    return [normalize_record(r, f"r{i}", index=i) for i, r in enumerate(RECORDS)]


def test_normalising_gives_a_typed_conversation():
    a, b, c = _convs()
    assert a == Conversation(
        "a",
        (
            Message("system", "Be brief."),
            Message("user", "Héllo?"),
            Message("assistant", "Hi.", reasoning_content="Greet back."),
        ),
    )
    # ShareGPT roles map to OpenAI ones; an empty reasoning is none; an int id is a string
    assert b.id == "7" and [m.role for m in b.messages] == ["user", "assistant"] * 2
    assert b.messages[3] == Message("assistant", "6") and b.messages[3].reasoning_content is None
    assert c.id == "conv-000002" and c.has("user") and c.has("assistant") and not c.has("system")
    with pytest.raises(FrozenInstanceError):
        a.id = "b"  # type: ignore[misc]


def test_chat_messages_carry_reasoning_only_when_set():
    a, b, _ = _convs()
    assert a.chat() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Héllo?"},
        {"role": "assistant", "content": "Hi.", "reasoning_content": "Greet back."},
    ]
    assert all("reasoning_content" not in m for m in b.chat())
    assert a.messages[2].chat(reasoning=False) == {"role": "assistant", "content": "Hi."}
    assert a.messages[2].without_reasoning() == Message("assistant", "Hi.")
    # the held-out prompt: through the first user turn, no reasoning
    assert a.prompt() == a.chat()[:2] and a.first_user() == 1
    two = Conversation("x", (Message("user", "q"), Message("assistant", "a", "r")))
    assert two.prompt() == [{"role": "user", "content": "q"}]


def test_the_content_hash_is_the_one_dict_conversations_had():
    """Pinned with the code before conversations were typed (the dicts of
    ``normalize_record``): the hashes in earlier prepare records stay comparable."""
    convs = _convs()
    assert conversation_set_sha256(convs) == (
        "108caf74c70f384c9d9178a3dd8ce0d22587905d7caf9d76eeebe988a67330bd"
    )
    assert conversation_set_sha256(convs[:1]) == (
        "7f6f7b606e57c589be1fa7f690e78f96e99d8a8931e696f20940a182b12f06bc"
    )
    renamed = replace(convs[0], id="a#2")
    assert conversation_set_sha256([renamed]) != conversation_set_sha256(convs[:1])
