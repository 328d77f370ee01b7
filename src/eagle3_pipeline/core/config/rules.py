"""The rules run on every composed config (a stage's, ``eagle3-compose``'s, and DVC's
``exp run -S`` through the hook), so a bad value or combination is refused before any
stage starts: each section's own ``check`` (its rules across keys, declared beside its
fields in :mod:`eagle3_pipeline.core.config.schema`), called from one loop, then every
declared bound."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

from eagle3_pipeline.core.config.schema import Config, check_tiny_architecture
from eagle3_pipeline.core.errors import ConfigError

__all__ = ["check_tiny_architecture", "validate"]


def validate(cfg: Config) -> Config:
    """Each section's rules, in the schema's order, then the bounds the types cannot
    express (the choice fields are Enums: OmegaConf refused a bad one already); raise
    :class:`ConfigError`."""
    for f in fields(cfg):
        check = getattr(getattr(cfg, f.name), "check", None)
        if check is not None:
            check(cfg)
    _check_bounds(cfg)
    return cfg


def _check_bounds(node: Any, prefix: str = "") -> None:
    """Every :func:`setting` field under ``node`` within its declared bounds."""
    for f in fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if is_dataclass(value):
            _check_bounds(value, f"{key}.")
        bounds = f.metadata.get("bounds")
        if bounds is None or value is None:
            continue
        ge, gt, le, lt = bounds
        for bad, words in (
            (ge is not None and value < ge, f">= {ge}"),
            (gt is not None and value <= gt, f"> {gt}"),
            (le is not None and value > le, f"<= {le}"),
            (lt is not None and value >= lt, f"< {lt}"),
        ):
            if bad:
                null = " (or null)" if "None" in str(f.type) else ""  # a nullable field
                raise ConfigError(f"{key}={value} must be {words}{null}")
