"""A damaged output that shares its bytes with DVC's cache: repair the cache object too.

Why: with ``cache.type`` hardlink or symlink (a user's choice for hidden states that run
to terabytes; this project's default is ``reflink,copy``), an output and its cache object
are one inode. Damaging the output in place (``truncate`` as root, a disk error, a
half-finished ``cp``) damages the cache object as well. A stage that then rewrites the
file atomically produces the right bytes -- and DVC, finding that hash "already cached",
links the workspace back to the damaged object: a half file and a clean ``dvc status``.

So a stage that finds one of its own outputs damaged calls :func:`release_damaged`
before redoing it: every cache object that is the same inode goes too, and DVC caches the
rewritten file afresh. Found by inode (one ``stat`` per cache file, only on damage), so
nothing here depends on DVC's hashing internals.
"""

from __future__ import annotations

import configparser
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def dvc_root(start: Path) -> Path | None:
    """The nearest directory at or above ``start`` holding ``.dvc/``."""
    for d in [start.resolve(), *start.resolve().parents]:
        if (d / ".dvc").is_dir():
            return d
    return None


def cache_dir(root: Path) -> Path:
    """DVC's local cache directory (``cache.dir`` of ``.dvc/config.local`` or
    ``.dvc/config``, relative to ``.dvc/``; default ``.dvc/cache``)."""
    found: str | None = None
    for name in ("config", "config.local"):  # the local file wins
        parser = configparser.ConfigParser()
        try:
            parser.read(root / ".dvc" / name, encoding="utf-8")
        except configparser.Error:
            continue
        value = parser.get("cache", "dir", fallback=None)
        if value:
            found = value.strip().strip("'\"")
    return (root / ".dvc" / found).resolve() if found else root / ".dvc" / "cache"


def shared_cache_objects(path: Path, root: Path) -> list[Path]:
    """Cache objects that are the same file as ``path`` (hard link, or the target of a
    symlink); empty when ``path`` has its own bytes (``copy``/``reflink``)."""
    try:
        st = os.stat(path)  # follows a symlink into the cache
    except OSError:
        return []
    if st.st_nlink < 2 and not path.is_symlink():
        return []
    cache = cache_dir(root)
    found: list[Path] = []
    for base, _dirs, names in os.walk(cache):
        for n in names:
            p = Path(base) / n
            try:
                s = os.stat(p, follow_symlinks=False)
            except OSError:
                continue
            if (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino):
                found.append(p)
    return found


def release_damaged(path: Path, root: Path | None = None) -> list[Path]:
    """Remove a damaged output and every cache object sharing its bytes; return the cache
    objects removed (DVC re-caches the file the stage writes in its place)."""
    root = root or dvc_root(path.parent)
    removed = shared_cache_objects(path, root) if root is not None else []
    for p in removed:
        p.unlink(missing_ok=True)
    path.unlink(missing_ok=True)
    if removed:
        log.warning(
            "%s was damaged and shared its bytes with DVC's cache (cache.type "
            "hardlink/symlink): removed the damaged cache object too (%s)",
            path,
            ", ".join(str(p) for p in removed),
        )
    return removed
