"""Installed package versions from metadata: nothing is imported (speculators alone costs
seconds to import), and a package that is missing reads as None."""

from __future__ import annotations

from collections.abc import Iterable
from importlib import metadata


def installed_versions(names: Iterable[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out
