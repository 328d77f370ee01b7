"""Records of a local JSONL or JSON file, read one at a time: ``(where, record)`` pairs,
``where`` being ``file:line`` or ``file[index]`` for the bad-lines report.

Why record by record: a published file may be cut (ShareGPT's stops mid-string) or hold
one broken record; a whole-file parse would lose everything. A broken record is reported
(:class:`~eagle3_pipeline.data.bad_input.ErrorLog`) and reading resumes at the next one; a
JSON array that ends inside a record is counted as its truncated tail.

Why not ijson, which streams an array item by item: its parser stops for good at the first
syntax error, so one broken record in the middle of a published file would end the read
(and every later conversation with it), where this scanner finds the record's end by its
brackets, reports it, and reads on. A test feeds a broken item mid-array and a cut tail
(``tests/data/test_sharegpt.py``) and counts the records after it.
"""

from __future__ import annotations

import json
import mmap
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eagle3_pipeline.data.bad_input import ErrorLog, TruncatedTail

NEWLINE = b"\n"

# One token of a JSON text for the record scanner: a string (escapes consumed; group 1 is
# its closing quote, absent only when the file ends inside it) or a bracket. UTF-8
# continuation bytes are >= 0x80, so scanning bytes never mistakes one for a quote.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(")?|[\[\]{}]', re.DOTALL)
_SPACE = re.compile(rb"[ \t\r\n]*")


def _skip_space(buf: Any, pos: int) -> int:
    m = _SPACE.match(buf, pos)
    return pos if m is None else m.end()


_SCALAR_END = re.compile(rb"[,\]\s]")


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
