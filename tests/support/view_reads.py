"""Which fields of the stage input views the code reads, as mypy sees it.

A mypy plugin (this module, loaded by mypy through ``plugins =``) writes one line per
attribute read, with the static type it is read on (``READ module.Class.field``). It sees
what a name-based search cannot: ``inputs.hardware.device`` is a read of
``TrainHardware.device``, not of every ``device``. A function shared by several stages
types its argument with a Protocol, so a read there is a read of the Protocol's member;
the plugin also writes each call that passes a class where a Protocol is expected
(``PASS module.View AS module.Proto``), and :func:`unread` credits a Protocol's member
read to the fields of exactly the classes passed as it (and, member by member, to the
sub-views those hold)."""

from __future__ import annotations

import dataclasses
import importlib
import os
import subprocess
import sys
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT_ENV = "EAGLE3_VIEW_READS_OUT"


# --------------------------------------------------------------------------- the plugin


def _write(line: str) -> None:
    with open(os.environ[OUT_ENV], "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def plugin(version: str) -> type[Any]:
    from mypy.nodes import MemberExpr
    from mypy.plugin import AttributeContext, FunctionSigContext, Plugin
    from mypy.types import CallableType, Instance, Type, get_proper_type

    class ViewReads(Plugin):
        def get_attribute_hook(self, fullname: str) -> Callable[[AttributeContext], Type] | None:
            if not fullname.startswith("eagle3_pipeline."):
                return None

            def hook(ctx: AttributeContext) -> Type:
                if isinstance(ctx.context, MemberExpr) and not ctx.is_lvalue:
                    _write(f"READ {fullname} {ctx.api.path}:{ctx.context.line}")
                return ctx.default_attr_type

            return hook

        def get_function_signature_hook(
            self, fullname: str
        ) -> Callable[[FunctionSigContext], CallableType] | None:
            if not fullname.startswith("eagle3_pipeline."):
                return None

            def hook(ctx: FunctionSigContext) -> CallableType:
                sig = ctx.default_signature
                for formal, exprs in zip(sig.arg_types, ctx.args, strict=False):
                    f = get_proper_type(formal)
                    if not (isinstance(f, Instance) and f.type.is_protocol):
                        continue
                    for e in exprs:
                        a = get_proper_type(ctx.api.get_expression_type(e))
                        if isinstance(a, Instance):
                            _write(f"PASS {a.type.fullname} AS {f.type.fullname}")
                return sig

            return hook

    return ViewReads


# --------------------------------------------------------------------------- running it


@dataclass(frozen=True)
class Reads:
    """What the plugin saw: attributes read (``module.Class.field``) and classes passed
    where a Protocol is expected (``(class, protocol)``, full names)."""

    fields: frozenset[str]
    passes: frozenset[tuple[str, str]]


def mypy_reads(work: Path, files: list[str] | None = None) -> Reads:
    """What the code in ``files`` (default: the package) reads, from a full mypy run with
    the plugin (no cache: a cached module is not re-read)."""
    out = work / "reads.txt"
    ini = work / "mypy.ini"
    ini.write_text(
        "[mypy]\n"
        f"plugins = {Path(__file__).resolve()}\n"
        "python_version = 3.11\nignore_missing_imports = True\nfollow_imports = silent\n",
        encoding="utf-8",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ini), "--cache-dir", os.devnull]
        + (files or ["src/eagle3_pipeline"]),
        cwd=ROOT,
        env={**os.environ, OUT_ENV: str(out)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode not in (0, 1):
        raise AssertionError(f"mypy failed ({proc.returncode}): {proc.stdout[-3000:]}{proc.stderr}")
    lines = out.read_text(encoding="utf-8").splitlines() if out.exists() else []
    return Reads(
        frozenset(ln.split()[1] for ln in lines if ln.startswith("READ ")),
        frozenset((ln.split()[1], ln.split()[3]) for ln in lines if ln.startswith("PASS ")),
    )


# --------------------------------------------------------------------------- the check


def _leaves(view: type, prefix: str = "") -> Iterator[tuple[str, type, str]]:
    """``(dotted key, class declaring it, field name)`` of every leaf of ``view``."""
    from eagle3_pipeline.core.inputs import Inputs

    hints = typing.get_type_hints(view)
    for f in dataclasses.fields(view):
        sub = hints[f.name]
        if isinstance(sub, type) and issubclass(sub, Inputs):
            yield from _leaves(sub, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", view, f.name


def _class(fullname: str) -> type | None:
    module, _, name = fullname.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _member_types(cls: type) -> dict[str, Any]:
    """The declared type of each member of ``cls``: a dataclass's fields, a Protocol's
    properties (their return annotation)."""
    if dataclasses.is_dataclass(cls):
        return dict(typing.get_type_hints(cls))
    out = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, property) and value.fget is not None:
                out[name] = typing.get_type_hints(value.fget).get("return")
    return out


def _fullname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def passed_as(passes: frozenset[tuple[str, str]]) -> set[tuple[str, str]]:
    """Every (class, Protocol) a value of the class reaches the Protocol's code as: the
    calls seen, through chains (a Protocol passed on as another), and member by member (a
    view passed as P, whose member m is typed as Protocol Q, passes its field m's class as
    Q)."""
    found = set(passes)
    while True:
        more = set()
        for a, p in found:
            more |= {(a, q) for b, q in found if b == p}
            a_cls, p_cls = _class(a), _class(p)
            if a_cls is None or p_cls is None or not getattr(p_cls, "_is_protocol", False):
                continue
            a_types = _member_types(a_cls)
            for m, q_type in _member_types(p_cls).items():
                b_type = a_types.get(m)
                if isinstance(q_type, type) and isinstance(b_type, type):
                    if getattr(q_type, "_is_protocol", False):
                        more.add((_fullname(b_type), _fullname(q_type)))
        if more <= found:
            return found
        found |= more


def _section(tp: Any) -> type | None:
    """The config section dataclass ``tp`` is (``X | None`` too), else None."""
    from eagle3_pipeline.core.inputs import Inputs

    args = [a for a in typing.get_args(tp) if a is not type(None)]
    tp = args[0] if len(args) == 1 else tp
    if isinstance(tp, type) and dataclasses.is_dataclass(tp) and not issubclass(tp, Inputs):
        return tp
    return None


def _section_leaves(cls: type, prefix: str) -> Iterator[tuple[str, type, str]]:
    """``(dotted key, class, field)`` of every leaf of config section ``cls``, nested
    sections (``model.gguf``) included."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        sub = _section(hints[f.name])
        if sub is not None:
            yield from _section_leaves(sub, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", cls, f.name


def unread(view: type, reads: Reads) -> list[str]:
    """The dotted keys of ``view`` that no code reads: neither on the class that declares
    them (or a base it inherits the field from) nor on a Protocol that class is passed as.
    A field holding a whole config section, once read, is checked down to the section's
    leaves, so a section read only in part is reported (make it a sub-view of what is
    read)."""
    protocols: dict[str, set[str]] = {}
    for a, p in passed_as(reads.passes):
        protocols.setdefault(a, set()).add(p)

    def read(owner: type, name: str) -> bool:
        for klass in owner.__mro__:
            qual = _fullname(klass)
            if f"{qual}.{name}" in reads.fields:
                return True
            if any(f"{p}.{name}" in reads.fields for p in protocols.get(qual, ())):
                return True
        return False

    out = []
    for key, owner, name in _leaves(view):
        if not read(owner, name):
            out.append(key)
            continue
        section = _section(typing.get_type_hints(owner)[name])
        if section is not None:  # the view holds the whole section: each leaf must be read
            out += [
                k for k, cls, leaf in _section_leaves(section, f"{key}.") if not read(cls, leaf)
            ]
    return out
