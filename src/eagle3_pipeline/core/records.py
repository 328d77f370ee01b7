"""Typed records: the JSON files one stage writes and others read.

Each stage's details (``metrics/details/<stage>.json``) and the extract stage's manifest
are dataclasses declared in the producing stage's subpackage (``train/record.py`` etc.),
each field once with what it is. Writers build the record and :meth:`Record.write` it;
readers get it back from :meth:`Record.read`, so a key renamed on one side and not the
other fails in a test, not in a plan that silently stops finding a figure.

Why a schema version: a file of another version (or one written before records were
versioned, or missing a key) is refused with one line naming the file and the stage that
rebuilds it, instead of a reader guessing at an older layout.

Reading validates the file against the dataclass with pydantic (strict, JSON mode), and
words its first error as ``key <dotted key>: expected <type>, found ...``.

Two field kinds besides plain ones: :func:`optional` (written only when set, so keys a
run does not produce -- the vLLM figures without ``validate.vllm`` -- stay absent as
before) and :func:`headline` (the figures DVC shows, see :mod:`eagle3_pipeline.core.metrics`).
"""

from __future__ import annotations

import enum
import functools
import json
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar, NoReturn, TypeVar

import pydantic

from eagle3_pipeline.core.errors import StageError, rebuild_hint
from eagle3_pipeline.core.io import atomic_write_json

R = TypeVar("R", bound="Record")


class RecordError(StageError):
    """A record file that cannot be read as this pipeline's schema: one line naming the
    file, what is wrong and which stage rebuilds it."""

    def __init__(self, source: str | Path, problem: str, stage: str) -> None:
        super().__init__(f"{source}: {problem}; {rebuild_hint(stage)}")
        self.source, self.problem, self.stage = str(source), problem, stage

    def __reduce__(self) -> Any:  # picklable, like any exception
        return type(self), (self.source, self.problem, self.stage)


def optional(*, headline: bool = False) -> Any:
    """A field written only when set: None means the key is absent from the file."""
    return field(default=None, metadata={"optional": True, "headline": headline})


def headline() -> Any:
    """A required field that is one of the figures DVC shows for the stage."""
    return field(metadata={"headline": True})


@dataclass(kw_only=True)
class Record:
    """Base of every record: the schema version and the JSON round trip."""

    STAGE: ClassVar[str]  # the stage that writes the file (and rebuilds it)
    # True: the headline goes to dvclive's summary (train, validate), written by the
    # stage's live.py; False: to metrics/<stage>.json
    HEADLINE_IN_DVCLIVE: ClassVar[bool] = False
    # A file without a version is read as this version (None: refused). For records whose
    # keys did not change when versions were introduced, so that old files stay usable.
    UNVERSIONED_AS: ClassVar[int | None] = None

    version: int = 1  # schema version; a subclass bumps its default when its keys change

    @classmethod
    def schema_version(cls) -> int:
        """The version this pipeline writes and reads (the ``version`` field's default)."""
        default = next(f.default for f in fields(cls) if f.name == "version")
        assert isinstance(default, int)
        return default

    @classmethod
    def headline_keys(cls) -> tuple[str, ...]:
        """The fields DVC shows, in declaration order."""
        return tuple(f.name for f in fields(cls) if f.metadata.get("headline"))

    @classmethod
    def required_keys(cls) -> tuple[str, ...]:
        return tuple(
            f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
        )

    def to_dict(self) -> dict[str, Any]:
        """The file's content: every field, ``version`` first, unset optional ones left out
        (in nested dataclasses too), nested dataclasses and Enums as their JSON form."""
        return plain(self)

    def headline(self) -> dict[str, Any]:
        """The headline fields that the run produced (unset optional ones left out)."""
        return {k: v for k in self.headline_keys() if (v := getattr(self, k)) is not None}

    def write(self, path: str | Path) -> None:
        """Atomically: a crash never leaves a half-written record."""
        atomic_write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls: type[R], data: Any, source: str | Path) -> R:
        """The record in ``data`` (a file's parsed JSON); :class:`RecordError` naming
        ``source`` for another schema version or a missing key. Keys this version does not
        declare are ignored."""
        if not isinstance(data, dict):
            cls._refuse(source, f"not a JSON object (a {type(data).__name__})")
        version = data.get("version", cls.UNVERSIONED_AS)
        if version != cls.schema_version():
            found = (
                "no schema version (written before records were versioned)"
                if version is None
                else f"schema version {version!r}"
            )
            cls._refuse(source, f"{found}, this pipeline reads version {cls.schema_version()}")
        missing = [k for k in cls.required_keys() if k not in data]
        if missing:
            cls._refuse(source, f"missing key(s) {', '.join(missing)}")
        try:
            return _adapter(cls).validate_json(json.dumps(data), strict=True)
        except pydantic.ValidationError as exc:
            cls._refuse(source, explain(exc, cls, data))

    @classmethod
    def read(cls: type[R], path: str | Path) -> R:
        """The record in ``path``; :class:`RecordError` when it is absent or unreadable."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            cls._refuse(path, "not found")
        except (OSError, UnicodeDecodeError) as exc:
            cls._refuse(path, f"unreadable ({type(exc).__name__}: {exc})")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            cls._refuse(path, f"not valid JSON ({exc})")
        return cls.from_dict(data, path)

    @classmethod
    def read_if_present(cls: type[R], path: str | Path) -> R | None:
        """Like :meth:`read`, but None when there is no file (no run wrote it yet)."""
        return cls.read(path) if Path(path).exists() else None

    @classmethod
    def _refuse(cls, source: str | Path, problem: str) -> NoReturn:
        raise RecordError(source, problem, cls.STAGE)


# --------------------------------------------------------------------------- types


def plain(value: Any) -> Any:
    """``value`` as JSON-ready data: a dataclass as a dict of its fields (an ``optional``
    field left out while None), an Enum as its value, tuples as lists."""
    if is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in fields(value):
            v = getattr(value, f.name)
            if v is None and f.metadata.get("optional"):
                continue
            out[f.name] = plain(v)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


_ADAPTERS: dict[type, pydantic.TypeAdapter[Any]] = {}


def _adapter(cls: type[R]) -> pydantic.TypeAdapter[R]:
    """pydantic's validator for a record class (built once: building it walks every type).

    Why pydantic, in strict JSON mode: a record read back is trusted by the stage that
    reads it, so a figure of the wrong type (a hand-edited or foreign file) must be refused
    where it is read, not fail later inside arithmetic far from the file; strict refuses
    ``"3"`` for an int and ``true`` for a count, JSON mode still takes an Enum's value, a
    list for a tuple and an int for a float (JSON has one number type)."""
    if cls not in _ADAPTERS:
        _ADAPTERS[cls] = pydantic.TypeAdapter(cls)
    return _ADAPTERS[cls]


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The resolved field types of a dataclass (its annotations are strings)."""
    return typing.get_type_hints(cls)


def _name(tp: Any) -> str:
    if tp is type(None):
        return "None"
    if typing.get_origin(tp) in (typing.Union, types.UnionType):  # each by its own name
        return " | ".join(_name(arg) for arg in typing.get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


Loc = tuple[int | str, ...]


def explain(exc: pydantic.ValidationError, cls: type, data: Any) -> str:
    """pydantic's first error as this pipeline words it: ``key <dotted key>: expected
    <type>, found <type> <value>`` or ``key <dotted key>: missing <fields>``.

    pydantic's locations name the alternative of a union they were tried against (``disk
    .DiskReading.fits``); the key a user edits has no such step, so the location is walked
    along the declared types. At a union, the one alternative whose errors all lie deeper
    than the union's own key (the value has its shape) says what is wrong; otherwise the
    union itself is named."""
    errors = [(tuple(e["loc"]), e["type"]) for e in exc.errors()]
    return _explain_at(cls, data, (), errors, errors[0][0])


def _explain_at(tp: Any, value: Any, key: Loc, errors: list[tuple[Loc, str]], first: Loc) -> str:
    """The message for the first of ``errors`` (locations relative to ``value``, whose
    declared type is ``tp`` and dotted key ``key``)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(members) == 1:
            return _explain_at(members[0], value, key, errors, first)
        tags = {_tag(m): m for m in members}
        if not first or first[0] not in tags:  # the value fits no alternative's shape
            return _wrong(value, tp, key)
        shaped = {
            tag: [(loc[1:], kind) for loc, kind in errors if loc and loc[0] == tag] for tag in tags
        }
        inside = [
            tag
            for tag, errs in shaped.items()
            if errs and all(_deeper(loc, kind) for loc, kind in errs)
        ]
        if len(inside) != 1:
            return _wrong(value, tp, key)
        tag = inside[0]
        errs = shaped[tag]
        return _explain_at(tags[tag], value, key, errs, errs[0][0])
    if not first:
        return _wrong(value, tp, key)
    step, rest = first[0], first[1:]
    if is_dataclass(tp) and isinstance(tp, type):
        gone = [str(loc[0]) for loc, kind in errors if kind == "missing" and len(loc) == 1]
        if gone:  # the value lacks fields: named first, all of them
            return f"key {_dotted(key)}: missing {', '.join(gone)}"
        inner_tp = _hints(tp)[str(step)]
    elif origin is dict:
        inner_tp = (typing.get_args(tp) or (Any, Any))[1]
    elif origin is tuple:
        args = typing.get_args(tp)
        inner_tp = args[0] if len(args) == 2 and args[1] is Ellipsis else args[int(step)]
    elif origin is list:
        inner_tp = (typing.get_args(tp) or (Any,))[0]
    else:
        return _wrong(value, tp, key)
    inner = value.get(step) if isinstance(value, dict) else None
    if isinstance(value, list) and isinstance(step, int) and step < len(value):
        inner = value[step]
    sub = [(loc[1:], kind) for loc, kind in errors if loc[:1] == (step,)]
    return _explain_at(inner_tp, inner, (*key, step), sub, rest)


def _deeper(loc: Loc, kind: str) -> bool:
    """An error below the value itself: inside a field, not the value's own type (a
    missing field is the value's own: it lacks the field)."""
    return len(loc) > (1 if kind == "missing" else 0)


def _tag(tp: Any) -> str:
    """How pydantic names a union's alternative in an error's location."""
    return tp.__name__ if isinstance(tp, type) else str(tp)


def _dotted(key: Loc) -> str:
    out = ""
    for step in key:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else str(step))
    return out


def _wrong(value: Any, tp: Any, key: Loc) -> str:
    return _message(value, tp, _dotted(key))


def _message(value: Any, tp: Any, key: str) -> str:
    shown = json.dumps(value)[:60] if _jsonable(value) else repr(value)[:60]
    return f"key {key}: expected {_name(tp)}, found {type(value).__name__} {shown}"


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
