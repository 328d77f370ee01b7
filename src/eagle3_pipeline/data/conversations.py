"""Conversations -> speculators training rows (``input_ids``, ``loss_mask``, ``seq_len``).

Loading: the built-in corpus, a local JSONL/JSON file in ShareGPT form
(``conversations: [{from, value}]``) or OpenAI form (``messages: [{role, content,
reasoning_content?}]``), or a Hugging Face dataset (network only). Every record is
normalised to OpenAI form; a bad record is reported with its file and line, counted by
reason, and skipped or fatal (``data.on_error``).

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

import hashlib
import json
import logging
import mmap
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config import ConfigError, DataConfig
from eagle3_pipeline.data.record import TurnTokens
from eagle3_pipeline.targets.chat import render_ids  # shared with validation

log = logging.getLogger(__name__)

ROLE_ALIASES = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "system": "system",
}
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
MAX_LOGGED_ERRORS = 5
NEWLINE = b"\n"


class StageInputError(ValueError):
    """Bad input that ``data.on_error=fail`` turns into a failed stage."""


class BadConversation(ValueError):
    """One input record that cannot be used; ``reason`` is the metrics key."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class BadInput:
    """One bad input record: where it is (``file:line`` or ``file[index]``), why, and the
    message a user reads."""

    where: str
    reason: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"where": self.where, "reason": self.reason, "message": self.message}


@dataclass
class ErrorLog:
    """Every bad input record, counted by reason.

    Why keep them all: a user fixing a 100k-line file needs every bad line in one pass
    (the prepare stage writes them to a report), so even ``on_error=fail`` reads to the end
    before it fails (:meth:`raise_if_failing`). The log names only the first few.
    """

    on_error: str = "skip"
    counts: Counter[str] = field(default_factory=Counter)
    unreadable: int = 0  # records that could not even be parsed (still conversations in)
    entries: list[BadInput] = field(default_factory=list)
    # turns cut from conversations that are still used, per reason (``data.roles=eagle``:
    # ``leading:<role>`` before the first human turn, ``empty_turn`` and ``after_empty_turn``)
    turns_dropped: Counter[str] = field(default_factory=Counter)
    # a JSON array file that ends inside its last record (published truncated)
    truncated: TruncatedTail | None = None

    def add(self, reason: str, where: str, message: str, unreadable: bool = False) -> None:
        self.counts[reason] += 1
        self.unreadable += unreadable
        self.entries.append(BadInput(where, reason, message))
        n = len(self.entries)
        if n <= MAX_LOGGED_ERRORS:
            log.warning("%s: %s", "bad input" if self.on_error == "fail" else "skipped", message)
        elif n == MAX_LOGGED_ERRORS + 1:
            log.warning("more bad input: every record is listed in the bad-lines report")

    def truncate(self, path: Path, tail: TruncatedTail) -> None:
        """The file ends inside record ``tail.record``: counted (``truncated_tail``), in
        the bad-lines report, and always logged -- a cut file is never silently short."""
        self.truncated = tail
        where = f"{path}[{tail.record}]"
        message = (
            f"{where}: the file ends inside this record (it starts at byte {tail.offset}; "
            f"{tail.bytes} bytes skipped): the file is truncated, the cut record is not used"
            if tail.bytes
            else f"{where}: the file ends before the JSON array is closed (byte {tail.offset})"
        )
        self.add("truncated_tail", where, message, unreadable=True)
        if len(self.entries) > MAX_LOGGED_ERRORS:
            log.warning("%s", message)

    def summary(self) -> str:
        """``3 bad records (malformed_json 2, non_utf8 1)``: the one line the log ends with."""
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        n = len(self.entries)
        return f"{n} bad record{'s' if n != 1 else ''}" + (f" ({reasons})" if reasons else "")

    def raise_if_failing(self, report: Path | None = None) -> None:
        """Under ``on_error=fail``: one error naming the count, the first bad record and the
        report that lists them all."""
        if self.on_error != "fail" or not self.entries:
            return
        where = f"; every one is listed in {report}" if report is not None else ""
        raise StageInputError(
            f"data: {self.summary()}; first: {self.entries[0].message}{where} "
            "(data.on_error=fail; fix them, or use data.on_error=skip to count and go on)"
        )


# --------------------------------------------------------------------------- loading

# One token of a JSON text for the record scanner: a string (escapes consumed; group 1 is
# its closing quote, absent only when the file ends inside it) or a bracket. UTF-8
# continuation bytes are >= 0x80, so scanning bytes never mistakes one for a quote.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(")?|[\[\]{}]', re.DOTALL)
_SPACE = re.compile(rb"[ \t\r\n]*")


def _skip_space(buf: Any, pos: int) -> int:
    m = _SPACE.match(buf, pos)
    return pos if m is None else m.end()


_SCALAR_END = re.compile(rb"[,\]\s]")


@dataclass(frozen=True)
class TruncatedTail:
    """A JSON array whose file ends inside it: the record it ends in (cut, skipped),
    where that record starts and how many bytes were left unread."""

    record: int
    offset: int
    bytes: int


def read_records(path: Path, errors: ErrorLog) -> Iterator[tuple[str, Any]]:
    """Yield ``(where, record)`` from a JSONL file (one object a line) or a JSON file (a
    list, or an object holding one list). ``where`` is ``file:line`` or ``file[index]``.

    Neither is read whole into memory twice: JSONL is read a line at a time, a JSON array
    record by record from a memory map (:func:`_read_json_array`)."""
    if not path.is_file():
        raise FileNotFoundError(f"data.path={path}: file not found")
    if is_json_document(path):
        if first_byte(path) == b"[":
            yield from _read_json_array(path, errors)
        else:
            yield from _read_json_document(path, path.read_bytes(), errors)
        return
    with open(path, "rb") as fh:
        for lineno, line in enumerate(fh, start=1):
            where = f"{path}:{lineno}"
            if not line.strip():
                errors.add(
                    "blank_line",
                    where,
                    f"{where}: blank line (JSONL holds one object a line)",
                    True,
                )
                continue
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                errors.add("non_utf8", where, f"{where}: not UTF-8 text (byte {exc.start})", True)
                continue
            try:
                yield where, json.loads(text)
            except json.JSONDecodeError as exc:
                errors.add(
                    "malformed_json",
                    where,
                    f"{where}: malformed JSON ({exc.msg}, column {exc.colno})",
                    True,
                )


def first_byte(path: Path) -> bytes:
    """The file's first byte that is not JSON whitespace (b"" for a blank file)."""
    with open(path, "rb") as fh:
        while chunk := fh.read(65536):
            if stripped := chunk.lstrip(b" \t\r\n"):
                return stripped[:1]
    return b""


def is_json_document(path: Path) -> bool:
    """A JSON file (a list, or an object holding one) rather than JSONL."""
    return path.suffix == ".json" or first_byte(path) == b"["


def document_records(data: Any) -> Any:
    """The conversations of a parsed JSON document: one conversation object, an object
    holding exactly one list, or the list itself (anything else is returned as is)."""
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if "messages" in data or "conversations" in data or len(lists) != 1:
            return [data]
        return lists[0]
    return data


def _value_end(buf: Any, start: int, size: int) -> int | None:
    """End (exclusive) of the JSON value starting at byte ``start``, found by brackets
    and strings only (the parser checks the rest); None when the file ends first."""
    if buf[start] not in b'{["':
        m = _SCALAR_END.search(buf, start)
        return None if m is None else max(m.start(), start + 1)
    depth = 0
    for m in _TOKEN.finditer(buf, start):
        c = buf[m.start()]
        if c == 0x22:  # a string
            if m.start(1) == -1:
                return None  # the file ends inside it
        elif c in b"{[":
            depth += 1
        else:
            depth -= 1
        if depth <= 0:
            return m.end()
    return None


def json_array_spans(
    buf: Any, errors: ErrorLog | None, path: Path
) -> Iterator[tuple[int, int, int]]:
    """``(index, start, end)`` byte spans of the top-level records of the JSON array in
    ``buf`` (a memory map or bytes starting, after whitespace, with ``[``).

    Why spans and not one ``json.loads``: a published file may be cut (ShareGPT's stops
    mid-string) or hold one broken record; a whole-file parse would lose everything. A
    broken separator is reported (``errors``) and scanning resumes at the next record;
    a file that ends inside the array is reported as its truncated tail
    (``errors.truncated``) and nothing past the file's end is read."""
    size = len(buf)
    pos = _skip_space(buf, 0) + 1  # past "["
    index = 0
    while True:
        pos = _skip_space(buf, pos)
        if pos < size and buf[pos] == 0x5D:  # "]": the array ends
            rest = _skip_space(buf, pos + 1)
            if rest < size and errors is not None:
                where = f"{path}[{index}]"
                errors.add(
                    "malformed_json",
                    where,
                    f"{where}: data after the array's end (byte {rest}) is ignored",
                )
            return
        end = _value_end(buf, pos, size) if pos < size else None
        if end is None:
            if errors is not None:
                errors.truncate(path, TruncatedTail(index, pos, size - pos))
            return
        yield index, pos, end
        index += 1
        pos = _skip_space(buf, end)
        if pos < size and buf[pos] == 0x2C:  # ","
            pos += 1
        elif pos < size and buf[pos] != 0x5D and errors is not None:
            where = f"{path}[{index}]"
            errors.add(
                "malformed_json",
                where,
                f"{where}: expected ',' or ']' after record {index - 1} "
                f"(byte {pos}); read on from there",
            )


def _read_json_array(path: Path, errors: ErrorLog) -> Iterator[tuple[str, Any]]:
    """Records of a JSON array file, parsed one at a time (``raw_decode`` on each record's
    bytes): one broken record is reported by index and byte offset, not the whole file."""
    decoder = json.JSONDecoder()
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        for index, start, end in json_array_spans(buf, errors, path):
            where = f"{path}[{index}]"
            try:
                text = buf[start:end].decode("utf-8")
            except UnicodeDecodeError as exc:
                errors.add(
                    "non_utf8", where, f"{where}: not UTF-8 text (byte {start + exc.start})", True
                )
                continue
            try:
                record, used = decoder.raw_decode(text)
                if text[used:].strip():
                    raise json.JSONDecodeError("extra data", text, used)
            except json.JSONDecodeError as exc:
                errors.add(
                    "malformed_json",
                    where,
                    f"{where}: malformed JSON ({exc.msg}, byte {start + exc.pos})",
                    True,
                )
                continue
            yield where, record


def _read_json_document(path: Path, raw: bytes, errors: ErrorLog) -> Iterator[tuple[str, Any]]:
    """A JSON file that is not an array (an object holding one list, or one
    conversation): parsed whole, as such files are small."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        where = f"{path}:{raw[: exc.start].count(NEWLINE) + 1}"
        errors.add("non_utf8", where, f"{where}: not UTF-8 text (byte {exc.start})", True)
        return
    except json.JSONDecodeError as exc:
        where = f"{path}:{exc.lineno}"
        errors.add("malformed_json", where, f"{where}: malformed JSON ({exc.msg})", True)
        return
    data = document_records(data)
    if not isinstance(data, list):
        errors.add(
            "malformed_json",
            str(path),
            f"{path}: a JSON file must hold a list of conversations",
            True,
        )
        return
    for i, rec in enumerate(data):
        yield f"{path}[{i}]", rec


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
) -> dict[str, Any]:
    """One input record -> ``{"id", "messages": [{role, content, reasoning_content?}]}``.

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
    messages: list[dict[str, Any]] = []
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
        msg: dict[str, Any] = {
            "role": role,
            "content": _check_text(turn.get(content_key), at, content_key),
        }
        for rk in REASONING_KEYS:
            if turn.get(rk) is not None and role == "assistant":
                reasoning = _check_text(turn[rk], at, rk)
                if reasoning:
                    msg["reasoning_content"] = reasoning
                break
        messages.append(msg)
    if not any(m["role"] == "user" for m in messages):
        raise BadConversation("no_user_turn", f"{where}: no user turn")
    rid = record.get("id", record.get("uuid"))
    cid = str(rid) if isinstance(rid, (str, int)) and str(rid) else f"conv-{index:06d}"
    return {"id": cid, "messages": messages}


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
) -> tuple[list[dict[str, Any]], ErrorLog, int]:
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
    convs: list[dict[str, Any]] = []
    seen: Counter[str] = Counter()
    n_in = 0
    for where, rec in records:
        n_in += 1
        try:
            trimmed: Counter[str] = Counter()
            conv = normalize_record(
                rec, where, data.format, index=n_in - 1, roles=str(data.roles), dropped=trimmed
            )
            if require_assistant and not any(m["role"] == "assistant" for m in conv["messages"]):
                raise BadConversation("no_assistant_turn", f"{where}: no assistant turn")
            errors.turns_dropped.update(trimmed)  # only for conversations that are used
        except BadConversation as exc:
            errors.add(exc.reason, where, str(exc))
            continue
        seen[conv["id"]] += 1
        if seen[conv["id"]] > 1:  # ids name held-out prompts: keep them unique
            conv["id"] = f"{conv['id']}#{seen[conv['id']]}"
        convs.append(conv)
    return convs, errors, n_in + errors.unreadable


# --------------------------------------------------------------------------- selection


def select(
    convs: list[Any],
    heldout_size: int,
    samples: int,
    seed: int,
    heldout_fits: Callable[[Any], bool] | None = None,
) -> tuple[list[Any], list[Any]]:
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


def conversation_set_sha256(convs: Iterable[dict[str, Any]]) -> str:
    """SHA-256 of a set of conversations' content, order aside: the sorted SHA-256 digests
    of each conversation's canonical JSON (id and messages, sorted keys, no spaces).

    Why: "trained on 1,000 ShareGPT conversations" does not say which; two runs (or a
    draft and its model card) can be compared by this one value. Order is left out since
    it is a property of the seed's shuffle, not of the data."""
    digests = sorted(
        hashlib.sha256(
            json.dumps(
                {"id": c["id"], "messages": c["messages"]},
                sort_keys=True,
                ensure_ascii=False,
                separators=(",", ":"),
            ).encode("utf-8")
        ).hexdigest()
        for c in convs
    )
    return hashlib.sha256("\n".join(digests).encode("ascii")).hexdigest()


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


def strip_reasoning(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]


def assistant_turn_ids(
    tokenizer: Any, context: list[dict[str, Any]], turn: dict[str, Any], eot_ids: list[int]
) -> tuple[list[int], list[int]]:
    """(context ids, turn ids) for one recorded assistant turn: the context is the
    generation-prompt render of ``context``; the turn runs through its end-of-turn token.

    Raises :class:`RowError` (``prefix_unstable``, ``no_end_of_turn``).
    """
    prompt = render_ids(tokenizer, context, generation_prompt=True)
    full = render_ids(tokenizer, [*context, turn], generation_prompt=False)
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
    conv: dict[str, Any], tokenizer: Any, eot_ids: list[int], reasoning: str
) -> tuple[list[Row], Counter[str]]:
    """Rows for a conversation's recorded assistant turns (no regeneration)."""
    rows: list[Row] = []
    errors: Counter[str] = Counter()
    msgs = conv["messages"]
    answer = -1
    for j, m in enumerate(msgs):
        if m["role"] != "assistant" or not any(p["role"] == "user" for p in msgs[:j]):
            continue
        answer += 1
        turn = m if reasoning == "keep" else strip_reasoning([m])[0]
        try:
            ctx, comp = assistant_turn_ids(tokenizer, msgs[:j], turn, eot_ids)
        except RowError as exc:
            errors[exc.reason] += 1
            log.debug("%s turn %d: %s", conv["id"], j, exc)
            continue
        rows.append(Row(conv["id"], j, ctx, comp, answer))
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


# --------------------------------------------------------------------------- held-out


def heldout_records(convs: list[dict[str, Any]], tokenizer: Any) -> list[dict[str, Any]]:
    """One record per held-out conversation: the context through the first user turn,
    its generation-prompt token ids, and the recorded answer to it (empty when the
    conversation has none)."""
    out = []
    for c in convs:
        msgs = c["messages"]
        first_user = next(i for i, m in enumerate(msgs) if m["role"] == "user")
        context = strip_reasoning(msgs[: first_user + 1])
        answer = next((m for m in msgs[first_user + 1 :] if m["role"] == "assistant"), None)
        out.append(
            {
                "id": c["id"],
                "messages": context,
                "prompt_ids": render_ids(tokenizer, context, generation_prompt=True),
                "reference": answer["content"] if answer else "",
                "reference_reasoning": (answer or {}).get("reasoning_content", ""),
            }
        )
    return out


def heldout_jsonl(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records)
