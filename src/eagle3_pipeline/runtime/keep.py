"""A failed stage loses nothing: its uncached outputs come back as they were.

Why: before it runs a stage's command, DVC deletes the stage's outputs. The cached ones
come back with ``dvc checkout <stage>``; the ones declared ``cache: false`` (the details,
the headline metrics, dvclive's curves) exist nowhere else, so a refused or crashed run
would leave a workspace that has lost the previous run's figures. Marking them
``persist`` would keep them but take the stage out of DVC's run-cache.

So the stage runner keeps a copy of those outputs after each success (under
``.dvc/tmp/eagle3-keep/<stage>/``: kilobytes, never tracked) and puts it back after any
failure, replacing whatever the failed run left half-written. Which outputs: read from
``dvc.yaml`` itself -- the ``cache: false`` entries of the stage that are not ``persist``
(a persistent output is resume state, and is the stage's own to keep) -- so the list is
never written twice.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger(__name__)

KEEP_DIR = Path(".dvc") / "tmp" / "eagle3-keep"
_VAR = re.compile(r"\$\{([^}]+)\}")


def _resolve(template: str, cfg: Any) -> str:
    def value(m: re.Match[str]) -> str:
        node = cfg
        for part in m.group(1).strip().split("."):
            node = node[part] if isinstance(node, dict) else getattr(node, part)
        return str(node)

    return _VAR.sub(value, template)


def volatile_outputs(stage: str, cfg: Any, dvc_yaml: Path = Path("dvc.yaml")) -> list[Path]:
    """The stage's ``cache: false`` outputs that are not ``persist`` (``outs``, ``metrics``
    and ``plots``), with ``${...}`` resolved against ``cfg``; empty outside a DVC project."""
    try:
        spec = (yaml.safe_load(dvc_yaml.read_text(encoding="utf-8")) or {})["stages"][stage]
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return []
    found: list[Path] = []
    for section in ("outs", "metrics", "plots"):
        for entry in spec.get(section) or []:
            if not isinstance(entry, dict):
                continue
            for path, opts in entry.items():
                opts = opts or {}
                if opts.get("cache", True) is False and not opts.get("persist", False):
                    with contextlib.suppress(AttributeError, KeyError, TypeError):
                        found.append(Path(_resolve(str(path), cfg)))
    return found


def _copy(src: Path, dst: Path) -> None:
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    elif dst.exists() or dst.is_symlink():
        dst.unlink()
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copy2(src, dst)


class Keeper:
    """The copy of one stage's uncached outputs from its last successful run."""

    def __init__(self, stage: str, outputs: list[Path], root: Path = KEEP_DIR) -> None:
        self.stage = stage
        self.outputs = outputs
        self.dir = root / stage

    @property
    def enabled(self) -> bool:
        return bool(self.outputs) and self.dir.parents[2].is_dir()  # a DVC project's .dvc/

    def save(self) -> None:
        """After a success: replace the kept copy with what the run just wrote."""
        if not self.enabled:
            return
        tmp = self.dir.with_name(self.dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        index = {}
        for i, out in enumerate(self.outputs):
            if out.exists():
                _copy(out, tmp / str(i))
                index[str(i)] = str(out)
        (tmp / "index.json").write_text(json.dumps(index, indent=1), encoding="utf-8")
        shutil.rmtree(self.dir, ignore_errors=True)
        tmp.rename(self.dir)

    def restore(self) -> list[Path]:
        """After a failure: put every kept output back; return the paths restored."""
        if not self.enabled or not (self.dir / "index.json").is_file():
            return []
        try:
            index = json.loads((self.dir / "index.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        wanted = {str(p) for p in self.outputs}
        restored: list[Path] = []
        for key, path in index.items():
            if path in wanted and (self.dir / key).exists():
                _copy(self.dir / key, Path(path))
                restored.append(Path(path))
        return restored
