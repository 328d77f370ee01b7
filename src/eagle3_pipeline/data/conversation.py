"""A conversation, typed: :class:`Conversation` of :class:`Message` s, and how one is
loaded.

Loading: the built-in corpus, a local JSONL/JSON file in ShareGPT form
(``conversations: [{from, value}]``) or OpenAI form (``messages: [{role, content,
reasoning_content?}]``), or a Hugging Face dataset (network only). Every record is
normalised to OpenAI form; a bad record is reported with its file and line, counted by
reason, and skipped or fatal (``data.on_error``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from eagle3_pipeline.core.config import ConfigError, DataConfig
from eagle3_pipeline.data.bad_input import BadConversation, ErrorLog
from eagle3_pipeline.data.json_records import read_records

log = logging.getLogger(__name__)

Role = Literal["system", "user", "assistant"]

ROLE_ALIASES: dict[str, Role] = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "system": "system",
}
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")

T = TypeVar("T")


@dataclass(frozen=True)
class Message:
    """One turn in OpenAI form; ``reasoning_content`` only on an assistant turn that has
    some (a record's empty reasoning is none)."""

    role: Role
    content: str
    reasoning_content: str | None = None

    def chat(self, reasoning: bool = True) -> dict[str, str]:
        """The chat template's message: ``role``, ``content``, and ``reasoning_content``
        only when set (and ``reasoning``)."""
        msg = {"role": self.role, "content": self.content}
        if reasoning and self.reasoning_content is not None:
            msg["reasoning_content"] = self.reasoning_content
        return msg

    def without_reasoning(self) -> Message:
        return replace(self, reasoning_content=None) if self.reasoning_content is not None else self


@dataclass(frozen=True)
class Conversation:
    """A normalised conversation: a unique ``id`` (it names held-out prompts) and its turns."""

    id: str
    messages: tuple[Message, ...]

    def chat(self) -> list[dict[str, str]]:
        """Every turn as the chat template takes it (reasoning where recorded)."""
        return [m.chat() for m in self.messages]

    def has(self, role: Role) -> bool:
        return any(m.role == role for m in self.messages)

    def first_user(self) -> int:
        """The index of the first user turn (a normalised conversation has one)."""
        return next(i for i, m in enumerate(self.messages) if m.role == "user")

    def prompt(self) -> list[dict[str, str]]:
        """The held-out prompt: the turns through the first user turn, reasoning dropped."""
        return [m.chat(reasoning=False) for m in self.messages[: self.first_user() + 1]]

    def canonical(self) -> dict[str, Any]:
        """``{"id", "messages"}`` in OpenAI form: what :func:`conversation_set_sha256` hashes."""
        return {"id": self.id, "messages": self.chat()}


def _check_text(value: Any, where: str, what: str) -> str:
    if not isinstance(value, str):
        raise BadConversation(
            "non_string_content", f"{where}: {what} is {type(value).__name__}, not a string"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadConversation("non_utf8", f"{where}: {what} is not valid UTF-8 text") from None
    return value


# EAGLE's rule (data.roles=eagle): the two roles each format may use, in turn order.
EAGLE_ROLES = {"sharegpt": ("human", "gpt"), "openai": ("user", "assistant")}


def eagle_turns(
    turns: list[Any],
    where: str,
    key: str,
    role_key: str,
    content_key: str,
    fmt: str,
    dropped: Counter[str],
) -> list[Any]:
    """The turns EAGLE's ShareGPT rule keeps (what EAGLE and speculators train on).

    - Leading turns before the first human one are dropped, whatever their role (in
      ShareGPT they are the bot's greeting or a share site's banner posted as ``system``),
      counted as ``leading:<role>`` in ``dropped``.
    - After that only the format's two roles may appear (``human``/``gpt``; in OpenAI form
      ``user``/``assistant``): a conversation with another (``system``, ``chatgpt``,
      ``bing``, ``bard``, even ``user`` in ShareGPT form) is skipped as ``odd_role:<role>``,
      the first such role naming it; then they must strictly alternate, human first, else
      it is skipped as ``broken_alternation``.
    - An empty (or blank) turn cuts the conversation before the exchange (human turn and
      its answer) that holds it: the earlier exchanges are kept, so alternation stays valid
      and no later turn refers to a missing one (``empty_turn`` and ``after_empty_turn``
      count the cut turns). Dropping only the empty turn would leave two human turns in a
      row; dropping the whole conversation would lose its good exchanges. When nothing is
      left the conversation is skipped as ``empty_turn``.
    """
    human, answer = EAGLE_ROLES[str(fmt)]

    def role(t: int) -> str:
        turn = turns[t]
        if not isinstance(turn, dict) or role_key not in turn:
            raise BadConversation(
                "malformed_record", f"{where} {key}[{t}]: a turn needs '{role_key}'"
            )
        return str(turn[role_key])

    roles = [role(t) for t in range(len(turns))]
    first = next((t for t, r in enumerate(roles) if r == human), None)
    if first is None:
        raise BadConversation("no_user_turn", f"{where}: no '{human}' turn")
    odd = next((r for r in roles[first:] if r not in (human, answer)), None)
    if odd is not None:
        raise BadConversation(
            f"odd_role:{odd}",
            f"{where}: role {odd!r} after the first '{human}' turn (data.roles=eagle takes "
            f"only '{human}' and '{answer}')",
        )
    for t, r in enumerate(roles[first:]):
        if r != (human, answer)[t % 2]:
            raise BadConversation(
                "broken_alternation",
                f"{where} {key}[{first + t}]: '{r}' where '{(human, answer)[t % 2]}' must "
                f"follow (data.roles=eagle: {human} and {answer} strictly alternate)",
            )
    kept = turns[first:]
    cut = next(
        (
            t
            for t, turn in enumerate(kept)
            if not isinstance(turn.get(content_key), str) or not turn[content_key].strip()
        ),
        None,
    )
    if cut is not None and isinstance(kept[cut].get(content_key), str):  # empty, not absent
        start = cut - cut % 2  # the exchange's human turn
        if start == 0:
            raise BadConversation(
                "empty_turn", f"{where} {key}[{first + cut}]: empty turn in the first exchange"
            )
        dropped["empty_turn"] += 1
        dropped["after_empty_turn"] += len(kept) - start - 1
        kept = kept[:start]
    for r in roles[:first]:
        dropped[f"leading:{r}"] += 1
    return kept


def normalize_record(
    record: Any,
    where: str,
    fmt: str = "auto",
    index: int = 0,
    roles: str = "any",
    dropped: Counter[str] | None = None,
) -> Conversation:
    """One input record -> a :class:`Conversation` (``{"id", "messages": [{role, content,
    reasoning_content?}]}`` in OpenAI form).

    ``roles="eagle"`` applies :func:`eagle_turns` first (turns it cuts are counted in
    ``dropped``). Raises :class:`BadConversation` naming the record and the problem.
    """
    if not isinstance(record, dict):
        raise BadConversation("malformed_record", f"{where}: a conversation must be a JSON object")
    if fmt == "auto":
        fmt = "openai" if "messages" in record else "sharegpt" if "conversations" in record else ""
        if not fmt:
            raise BadConversation(
                "unknown_format", f"{where}: no 'messages' (OpenAI) or 'conversations' (ShareGPT)"
            )
    key, role_key, content_key = (
        ("messages", "role", "content") if fmt == "openai" else ("conversations", "from", "value")
    )
    turns = record.get(key)
    if not isinstance(turns, list):
        raise BadConversation("malformed_record", f"{where}: '{key}' must be a list of turns")
    if not turns:
        raise BadConversation("empty_conversation", f"{where}: '{key}' is empty")
    if roles == "eagle":
        trimmed: Counter[str] = Counter()
        turns = eagle_turns(turns, where, key, role_key, content_key, fmt, trimmed)
        if dropped is not None:
            dropped.update(trimmed)
    messages: list[Message] = []
    for t, turn in enumerate(turns):
        at = f"{where} {key}[{t}]"
        if not isinstance(turn, dict) or role_key not in turn:
            raise BadConversation("malformed_record", f"{at}: a turn needs '{role_key}'")
        role = (
            ROLE_ALIASES.get(str(turn[role_key]).lower())
            if isinstance(turn[role_key], str)
            else None
        )
        if role is None:
            raise BadConversation("unknown_role", f"{at}: unknown role {turn[role_key]!r}")
        content = _check_text(turn.get(content_key), at, content_key)
        reasoning: str | None = None
        for rk in REASONING_KEYS:
            if turn.get(rk) is not None and role == "assistant":
                reasoning = _check_text(turn[rk], at, rk) or None  # empty reasoning is none
                break
        messages.append(Message(role, content, reasoning))
    if not any(m.role == "user" for m in messages):
        raise BadConversation("no_user_turn", f"{where}: no user turn")
    rid = record.get("id", record.get("uuid"))
    cid = str(rid) if isinstance(rid, (str, int)) and str(rid) else f"conv-{index:06d}"
    return Conversation(cid, tuple(messages))


def load_hf_records(data: DataConfig) -> Iterator[tuple[str, Any]]:
    """Records of a Hugging Face dataset; a clear error when the hub cannot be reached."""
    import os

    if os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True") or os.environ.get(
        "HF_DATASETS_OFFLINE"
    ) in ("1", "true", "True"):
        raise ConfigError(
            f"data.source=hf, data.path={data.path}: the Hugging Face hub is disabled "
            "(HF_HUB_OFFLINE): use a local file (data.source=file) or the builtin corpus"
        )
    try:
        from datasets import load_dataset

        ds = load_dataset(data.path, split=data.split)
    except Exception as exc:  # noqa: BLE001 - network, auth and naming errors all end here
        raise ConfigError(
            f"data.source=hf, data.path={data.path}, split {data.split}: cannot load "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            "without network, use a local file (data.source=file) or the builtin corpus"
        ) from None
    for i, rec in enumerate(ds):
        yield f"{data.path}[{i}]", rec


def load_conversations(
    data: DataConfig, seed: int, require_assistant: bool = True
) -> tuple[list[Conversation], ErrorLog, int]:
    """All usable conversations of the configured source, the bad-input log, and the
    number of records read. ``require_assistant``: without regeneration a conversation
    with no assistant turn has nothing to supervise; with it, user turns suffice."""
    errors = ErrorLog(on_error=data.on_error)
    if data.source == "builtin":
        from eagle3_pipeline.core.corpus import builtin_conversations

        records: Iterable[tuple[str, Any]] = (
            (f"builtin[{i}]", c) for i, c in enumerate(builtin_conversations(seed))
        )
    elif data.source == "file":
        records = read_records(Path(str(data.path)), errors)
    elif data.source == "hf":
        records = load_hf_records(data)
    else:
        raise ConfigError(f"data.source={data.source!r} is not builtin, file or hf")
    convs: list[Conversation] = []
    seen: Counter[str] = Counter()
    n_in = 0
    for where, rec in records:
        n_in += 1
        try:
            trimmed: Counter[str] = Counter()
            conv = normalize_record(
                rec, where, data.format, index=n_in - 1, roles=str(data.roles), dropped=trimmed
            )
            if require_assistant and not conv.has("assistant"):
                raise BadConversation("no_assistant_turn", f"{where}: no assistant turn")
            errors.turns_dropped.update(trimmed)  # only for conversations that are used
        except BadConversation as exc:
            errors.add(exc.reason, where, str(exc))
            continue
        seen[conv.id] += 1
        if seen[conv.id] > 1:  # ids name held-out prompts: keep them unique
            conv = replace(conv, id=f"{conv.id}#{seen[conv.id]}")
        convs.append(conv)
    return convs, errors, n_in + errors.unreadable


# --------------------------------------------------------------------------- selection


def select(
    convs: Sequence[T],
    heldout_size: int,
    samples: int,
    seed: int,
    heldout_fits: Callable[[T], bool] | None = None,
) -> tuple[list[T], list[T]]:
    """(held-out, training) conversations: a seeded random sample, not the file's first N.

    One shuffle with the seed: the first ``heldout_size`` conversations in that order
    that ``heldout_fits`` (a held-out prompt must leave room for an answer in the target's
    window) are held out, the next ``samples`` of the others are trained on. So the
    held-out set never depends on ``train.samples``, never meets the training set, and the
    training set for N is a prefix of the one for any M > N.
    """
    if heldout_size >= len(convs):
        raise ConfigError(
            f"data.heldout_size={heldout_size} leaves no training conversation "
            f"({len(convs)} usable conversations)"
        )
    order = list(range(len(convs)))
    random.Random(seed).shuffle(order)
    held_idx: list[int] = []
    for i in order:
        if len(held_idx) == heldout_size:
            break
        if heldout_fits is None or heldout_fits(convs[i]):
            held_idx.append(i)
    if len(held_idx) < heldout_size:
        log.warning(
            "only %d conversations have a first prompt short enough to hold out "
            "(data.heldout_size=%d)",
            len(held_idx),
            heldout_size,
        )
    taken = set(held_idx)
    held = [convs[i] for i in held_idx]
    train = [convs[i] for i in order if i not in taken][:samples]
    if len(train) < samples:
        log.warning(
            "train.samples=%d but only %d conversations remain after %d held out: using all",
            samples,
            len(train),
            len(held),
        )
    return held, train


def conversation_set_sha256(convs: Iterable[Conversation]) -> str:
    """SHA-256 of a set of conversations' content, order aside: the sorted SHA-256 digests
    of each conversation's canonical JSON (id and messages, sorted keys, no spaces).

    Why: "trained on 1,000 ShareGPT conversations" does not say which; two runs (or a
    draft and its model card) can be compared by this one value. Order is left out since
    it is a property of the seed's shuffle, not of the data."""
    digests = sorted(
        hashlib.sha256(
            json.dumps(
                c.canonical(),
                sort_keys=True,
                ensure_ascii=False,
                separators=(",", ":"),
            ).encode("utf-8")
        ).hexdigest()
        for c in convs
    )
    return hashlib.sha256("\n".join(digests).encode("ascii")).hexdigest()
