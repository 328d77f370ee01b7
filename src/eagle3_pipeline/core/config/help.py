"""What ``--help`` and the key map say of a key: its default, what it accepts and its
one-line doc, read from the schema.

Text for people only: no stage output depends on it, so it is not a code dep of any stage
(``eagle3-graph``'s ``TEXT_ONLY``) and rewording it reruns nothing.
"""

from __future__ import annotations

import types
from dataclasses import MISSING, dataclass, fields, is_dataclass
from enum import Enum
from typing import Any, get_args, get_origin, get_type_hints

from eagle3_pipeline.core.config.schema import Config, describe


@dataclass(frozen=True)
class KeyFacts:
    """One configuration key as ``--help`` and the key map show it, from the schema."""

    key: str  # dotted
    default: str  # the schema's default, as YAML writes it (a section: its keys' defaults)
    accepts: str  # the type, the Enum's choices, the bounds, "or null"
    doc: str  # the field's one-line description (a section: its class docstring's first line)


def _show(value: Any) -> str:
    if isinstance(value, Enum):
        return str(value.value)
    if value is None:
        return "null"
    if value == "":
        return '""'
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if is_dataclass(value):
        return "{...}"
    return str(value)


def _accepts(tp: Any, bounds: tuple[float | None, ...] | None) -> str:
    union = isinstance(tp, types.UnionType)
    nullable = union and type(None) in get_args(tp)
    base = next(a for a in get_args(tp) if a is not type(None)) if union else tp
    item = get_args(base)[0] if get_origin(base) is list else None
    if isinstance(base, type) and issubclass(base, Enum):
        text = " | ".join(str(m.value) for m in base)
    elif isinstance(item, type) and issubclass(item, Enum):
        text = "list of " + " | ".join(str(m.value) for m in item)
    elif get_args(base):  # list[int], dict[...]
        text = str(base).replace("typing.", "")
    else:
        text = getattr(base, "__name__", str(base))
    if bounds:
        ge, gt, le, lt = bounds
        parts = [f">= {ge}" if ge is not None else "", f"> {gt}" if gt is not None else ""]
        parts += [f"<= {le}" if le is not None else "", f"< {lt}" if lt is not None else ""]
        text += " " + ", ".join(x for x in parts if x)
    return text + (", or null" if nullable else "")


def key_facts(key: str) -> KeyFacts:
    """What the schema says of dotted ``key``: default, accepted values, description."""
    f = describe(Config, key)
    *parents, leaf = key.split(".")
    value: Any = Config()
    for part in parents:
        value = getattr(value, part, None) if value is not None else None
    if value is not None:
        default = _show(getattr(value, leaf))
    elif f.default is not MISSING:  # under a section that is null by default: its own
        default = _show(f.default)
    elif f.default_factory is not MISSING:
        default = _show(f.default_factory())
    else:
        default = "(required)"
    tp = get_type_hints(_owner(key))[f.name]
    section = next((a for a in get_args(tp) or (tp,) if is_dataclass(a)), None)
    doc = f.metadata.get("doc") or ""
    if section is not None and not doc:
        doc = " ".join((section.__doc__ or "").strip().split("\n\n")[0].split())
    accepts = "section" if section is not None else _accepts(tp, f.metadata.get("bounds"))
    return KeyFacts(key, default, accepts, doc)


def leaf_keys(key: str = "") -> list[str]:
    """``key`` itself when it is a value; every value key under it when it is a section
    (the whole schema for ``""``), in declaration order."""
    cls: Any = Config
    if key:
        hint = get_type_hints(_owner(key))[key.split(".")[-1]]
        cls = next((a for a in get_args(hint) or (hint,) if is_dataclass(a)), None)
        if cls is None:
            return [key]
    out: list[str] = []
    for f in fields(cls):
        out += leaf_keys(f"{key}.{f.name}" if key else f.name)
    return out


def _owner(key: str) -> Any:
    """The dataclass that declares dotted ``key``'s last part."""
    owner: Any = Config
    for part in key.split(".")[:-1]:
        hint = get_type_hints(owner)[part]
        owner = next(a for a in get_args(hint) or (hint,) if is_dataclass(a))
    return owner


def keys_help(keys: list[str]) -> str:
    """``--help``'s list of the keys a stage reads: each with its default and description
    (a section a stage reads whole: each of its keys)."""
    lines = ["Keys this stage reads (override as key=value; docs/configuration.md has all):"]
    for key in [leaf for k in keys for leaf in leaf_keys(k)]:
        k = key_facts(key)
        lines.append(f"  {k.key} = {k.default}  [{k.accepts}]")
        lines.append(f"      {k.doc}")
    return "\n".join(lines) + "\n"
