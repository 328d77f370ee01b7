"""Stage input views: each stage declares, once, the configuration it reads.

Why: a stage must rerun when, and only when, a value it reads changes, so ``dvc.yaml``
lists those keys under the stage's ``params:``. Inferring that list from the code (an
analysis following every ``cfg.x.y`` through calls) was larger than any module of the
product and broke on harmless refactors. A view turns the inference into a declaration:

- each stage has one frozen view (``TargetInputs``, ``TrainInputs``, ...) shaped like the
  composed config but holding only what the stage reads: a field is named as the config
  key it reads, and is a value, a whole config section (the stage reads all of it) or a
  smaller view (``TrainInputs.hardware`` holds only the hardware keys train reads), so
  ``inputs.hardware.device`` reads ``hardware.device``;
- the stage's entrypoint builds it from the composed config (:meth:`Inputs.from_config`)
  and the code below ``stages/`` receives views and values, never the whole ``Config`` (a
  test fails when a module below ``stages/`` imports it): a read of an undeclared key is a
  type error that ``mypy`` reports, and a declared key no code reads fails a test;
- ``eagle3-graph`` writes each stage's ``params:`` from its view's keys
  (:meth:`Inputs.keys`), less those its ``dvc.yaml`` entry already templates
  (``${paths.draft}``: DVC tracks them through the template).

A field made with :func:`untracked` is read but not listed (a content-keyed cache's place:
where it lies changes no result), with its reason next to it.

A function shared by several stages types its argument with a :class:`typing.Protocol` of
what it reads, which each stage's view (and the whole config, for tools) satisfies.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Self, get_type_hints

# the field metadata entry saying why a field is not a param of the stage
UNTRACKED = "eagle3_untracked"


def untracked(why: str) -> Any:
    """A view field the stage reads but DVC need not track, and ``why``."""
    return dataclasses.field(metadata={UNTRACKED: why})


def cache_place() -> Any:
    """The field of ``paths.cache``: read, never tracked (a content-keyed cache outside
    every output: where it lies changes no result)."""
    return untracked(
        "content-keyed caches (regenerated turns, file hashes) outside every output: "
        "where they lie changes no result"
    )


@dataclass(frozen=True)
class Inputs:
    """Base of the stage input views (see the module's docstring)."""

    @classmethod
    def from_config(cls, node: Any) -> Self:
        """The view of ``node`` (the composed config, or the section a sub-view mirrors):
        each field read from the attribute of its name, sub-views recursively."""
        return cls(
            **{
                name: sub.from_config(getattr(node, name)) if sub else getattr(node, name)
                for name, sub in _fields(cls)
            }
        )

    def dump(self, path: Path) -> None:
        """Write the view as YAML (what a stage hands the processes it starts: torchrun's
        workers build the same view from it with :meth:`load`)."""
        from omegaconf import OmegaConf

        from eagle3_pipeline.core.io import atomic_write_text

        atomic_write_text(path, OmegaConf.to_yaml(OmegaConf.structured(self)))

    @classmethod
    def load(cls, path: Path) -> Self:
        """The view :meth:`dump` wrote: its values read back through the config's schema
        (types and enums as in a params file), the keys it does not hold left out."""
        from omegaconf import OmegaConf

        from eagle3_pipeline.core.config import Config

        node = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(path))
        return cls.from_config(OmegaConf.to_object(node))

    @classmethod
    def keys(cls, prefix: str = "", tracked: bool = False) -> list[str]:
        """Every dotted key the view reads (a sub-view's keys in its place), in
        declaration order; ``tracked``: less the :func:`untracked` ones."""
        out: list[str] = []
        for name, sub in _fields(cls):
            if sub:
                out += sub.keys(f"{prefix}{name}.", tracked)
            elif not (tracked and UNTRACKED in _metadata(cls, name)):
                out.append(f"{prefix}{name}")
        return out


def _metadata(cls: type[Inputs], name: str) -> Any:
    return next(f.metadata for f in fields(cls) if f.name == name)


_FIELDS: dict[type[Inputs], tuple[tuple[str, type[Inputs] | None], ...]] = {}


def _fields(cls: type[Inputs]) -> tuple[tuple[str, type[Inputs] | None], ...]:
    """Each field's name with its sub-view class (None for a value or a config section)."""
    if cls not in _FIELDS:
        hints = get_type_hints(cls)
        _FIELDS[cls] = tuple(
            (f.name, h if isinstance(h := hints[f.name], type) and issubclass(h, Inputs) else None)
            for f in fields(cls)
        )
    return _FIELDS[cls]
