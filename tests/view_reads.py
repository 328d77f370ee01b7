"""Which fields of the stage input views the code reads, as mypy sees it.

A mypy plugin (this module, loaded by mypy through ``plugins =``) writes one line per
attribute read, with the static type it is read on: ``module.Class.field file:line``. It
sees what a name-based search cannot: ``inputs.hardware.device`` is a read of
``TrainHardware.device``, not of every ``device``. A read through a Protocol (a function
shared by several stages types its argument with one) is a read of the Protocol's member;
:func:`unread` credits it to the view fields of that name that satisfy the Protocol."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT_ENV = "EAGLE3_VIEW_READS_OUT"


# --------------------------------------------------------------------------- the plugin


def plugin(version: str) -> type[Any]:
    from mypy.nodes import MemberExpr
    from mypy.plugin import AttributeContext, Plugin
    from mypy.types import Type

    class ViewReads(Plugin):
        def get_attribute_hook(self, fullname: str) -> Callable[[AttributeContext], Type] | None:
            if not fullname.startswith("eagle3_pipeline."):
                return None

            def hook(ctx: AttributeContext) -> Type:
                if isinstance(ctx.context, MemberExpr) and not ctx.is_lvalue:
                    with open(os.environ[OUT_ENV], "a", encoding="utf-8") as fh:
                        fh.write(f"{fullname} {ctx.api.path}:{ctx.context.line}\n")
                return ctx.default_attr_type

            return hook

    return ViewReads


# --------------------------------------------------------------------------- running it


def mypy_reads(work: Path, files: list[str] | None = None) -> set[str]:
    """``module.Class.field`` of every attribute read in ``files`` (default: the package),
    from a full mypy run with the plugin (no cache: a cached module is not re-read)."""
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
    text = out.read_text(encoding="utf-8") if out.exists() else ""
    return {line.split()[0] for line in text.splitlines() if line.strip()}


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


def _views(view: type) -> Iterator[type]:
    """``view`` and its sub-view classes."""
    from eagle3_pipeline.core.inputs import Inputs

    yield view
    hints = typing.get_type_hints(view)
    for f in dataclasses.fields(view):
        sub = hints[f.name]
        if isinstance(sub, type) and issubclass(sub, Inputs):
            yield from _views(sub)


def _protocol_members(fullname_class: str) -> set[str] | None:
    """The members of ``module.Class`` when it is a Protocol, else None."""
    module, _, name = fullname_class.rpartition(".")
    try:
        cls = getattr(__import__(module, fromlist=[name]), name)
    except (ImportError, AttributeError):
        return None
    if not getattr(cls, "_is_protocol", False):
        return None
    return (
        set(typing.get_protocol_members(cls))
        if hasattr(typing, "get_protocol_members")
        else {k for k in vars(cls) if not k.startswith("_")}
    )


def _satisfies(view: type, members: set[str]) -> bool:
    names = {f.name for f in dataclasses.fields(view)} | {
        k for k in dir(view) if not k.startswith("_")
    }
    return members <= names


def unread(view: type, reads: set[str]) -> list[str]:
    """The dotted keys of ``view`` that no code reads: neither on the view class that
    declares them nor, by name, on a Protocol that class satisfies."""
    protocols: dict[str, set[str]] = {}
    read_names: dict[str, set[str]] = {}
    for r in reads:
        cls, _, attr = r.rpartition(".")
        read_names.setdefault(cls, set()).add(attr)
    for cls in read_names:
        members = _protocol_members(cls)
        if members is not None:
            protocols[cls] = members
    out = []
    for key, owner, name in _leaves(view):
        qual = f"{owner.__module__}.{owner.__qualname__}"
        if name in read_names.get(qual, set()):
            continue
        if any(
            name in read_names[p] and _satisfies(owner, members) for p, members in protocols.items()
        ):
            continue
        out.append(key)
    return out
