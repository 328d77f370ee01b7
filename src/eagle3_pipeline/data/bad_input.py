"""Bad input: one unusable record (:class:`BadConversation` while normalising,
:class:`BadInput` once logged), and the log of every one (:class:`ErrorLog`), counted by
reason, that the bad-lines report and ``data.on_error`` are decided from."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

MAX_LOGGED_ERRORS = 5


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


@dataclass(frozen=True)
class TruncatedTail:
    """A JSON array whose file ends inside it: the record it ends in (cut, skipped),
    where that record starts and how many bytes were left unread."""

    record: int
    offset: int
    bytes: int


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
