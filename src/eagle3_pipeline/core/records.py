"""Typed records: the JSON files one stage writes and others read.

Each stage's details (``metrics/details/<stage>.json``) and the extract stage's manifest
are dataclasses declared in the producing stage's subpackage (``train/record.py`` etc.),
each field once with what it is. Writers build the record and :meth:`Record.write` it;
readers get it back from :meth:`Record.read`, so a key renamed on one side and not the
other fails in a test, not in a plan that silently stops finding a figure.

Why a schema version: a file of another version (or one written before records were
versioned, or missing a key) is refused with one line naming the file and the stage that
rebuilds it, instead of a reader guessing at an older layout.

Two field kinds besides plain ones: :func:`optional` (written only when set, so keys a
run does not produce -- the vLLM figures without ``validate.vllm`` -- stay absent as
before) and :func:`headline` (the figures DVC shows, see :mod:`eagle3_pipeline.core.metrics`).
"""

from __future__ import annotations

import enum
import json
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar, NoReturn, TypeVar

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
        hints = _hints(cls)
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in data:
                try:
                    values[f.name] = _coerce(data[f.name], hints[f.name], f.name)
                except _WrongType as exc:
                    cls._refuse(source, str(exc))
        return cls(**values)

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


class _WrongType(ValueError):
    """A value that is not of its field's declared type (message: the key and both types);
    ``key``: the dotted key the message names."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The resolved field types of a dataclass (its annotations are strings), cached."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _name(tp: Any) -> str:
    if tp is type(None):
        return "None"
    if typing.get_origin(tp) in (typing.Union, types.UnionType):  # each by its own name
        return " | ".join(_name(arg) for arg in typing.get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` (parsed JSON) as declared type ``tp``: checked all the way down, nested
    dataclasses and Enums built from their JSON form; :class:`_WrongType` names ``key``
    (dotted into nested fields, ``[i]`` into lists) and both types.

    Why here and not in each reader: a record read back is trusted by the stage that
    reads it, so a figure of the wrong type (a hand-edited or foreign file) must be
    refused where it is read, in one line naming the file and the key, not fail later
    inside arithmetic far from the file."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except _WrongType as exc:
                errors.append(exc)
        # one alternative the value has the shape of (its error is inside, at a deeper
        # key: a union of dataclasses): that one's error says what is wrong
        inside = [e for e in errors if e.key != key]
        if len(errors) == 1 or len(inside) == 1:
            raise (inside or errors)[0]
        raise _WrongType(_message(value, tp, key), key)
    if origin is typing.Literal:
        if value in typing.get_args(tp):
            return value
        raise _WrongType(_message(value, tp, key), key)
    if origin in (list, tuple, dict):
        args = typing.get_args(tp)
        if origin is dict:
            if not isinstance(value, dict):
                raise _WrongType(_message(value, tp, key), key)
            kt, vt = args or (Any, Any)
            return {
                _coerce(k, kt, f"{key}.{k}"): _coerce(v, vt, f"{key}.{k}") for k, v in value.items()
            }
        if not isinstance(value, list | tuple):
            raise _WrongType(_message(value, tp, key), key)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise _WrongType(_message(value, tp, key), key)
            return tuple(
                _coerce(v, t, f"{key}[{i}]")
                for i, (v, t) in enumerate(zip(value, args, strict=True))
            )
        item = args[0] if args else Any
        items = [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if isinstance(tp, type):
        if is_dataclass(tp):
            if isinstance(value, tp):
                return value
            if not isinstance(value, dict):
                raise _WrongType(_message(value, tp, key), key)
            hints = _hints(tp)
            names = {f.name for f in fields(tp)}
            missing = [
                f.name
                for f in fields(tp)
                if f.default is MISSING and f.default_factory is MISSING and f.name not in value
            ]
            if missing:
                raise _WrongType(f"key {key}: missing {', '.join(missing)}", key)
            return tp(
                **{k: _coerce(v, hints[k], f"{key}.{k}") for k, v in value.items() if k in names}
            )
        if issubclass(tp, enum.Enum):
            try:
                return tp(value)
            except ValueError:
                raise _WrongType(_message(value, tp, key), key) from None
        if tp is float:
            if isinstance(value, int | float) and not isinstance(value, bool):
                return value
            raise _WrongType(_message(value, tp, key), key)
        if tp is int and isinstance(value, bool):
            raise _WrongType(_message(value, tp, key), key)
        if isinstance(value, tp):
            return value
        raise _WrongType(_message(value, tp, key), key)
    return value  # a construct this checker does not know: taken as written


def _message(value: Any, tp: Any, key: str) -> str:
    shown = json.dumps(value)[:60] if _jsonable(value) else repr(value)[:60]
    return f"key {key}: expected {_name(tp)}, found {type(value).__name__} {shown}"


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
