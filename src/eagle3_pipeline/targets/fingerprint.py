"""A cheap fingerprint of a local target, so that changing it in place reruns the graph.

With ``model.path`` (or a hub snapshot) the target's files live outside the repository.
Naming the directory as a DVC dependency would make DVC hash every weight shard: hours
for a 600 GB checkpoint the first time, and again whenever DVC's state database misses.
Not naming it means a checkpoint fine-tuned or replaced in place reruns nothing, and the
draft is trained for a model that no longer exists. So the preflight stage, which runs on
every ``dvc repro``, writes this fingerprint to a small JSON file and the target stage
depends on that file (DVC hashes only those few kilobytes):

- config, weight index, tokenizer, chat template and code files: SHA-256 of their content;
- weight shards (and any file over :data:`SMALL_FILE_BYTES`): size and modification time
  (``model.fingerprint=stat``, the default: a ``stat`` per shard, milliseconds), or their
  SHA-256 (``model.fingerprint=content``), each read once and then remembered by path,
  size, mtime and inode under ``paths.cache`` so that an unchanged shard is never re-read.

The stat mode reruns the graph when a shard is merely touched (its mtime changes); the
content mode does not, at the price of reading a changed shard in full once.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.io import atomic_write_json

SMALL_FILE_BYTES = 64 * 1024 * 1024  # larger non-weight files are treated like shards
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack")
SKIPPED_DIRS = {".git", ".cache", "__pycache__", ".huggingface"}
CHUNK = 8 * 1024 * 1024


def _files(model_dir: Path) -> list[Path]:
    out = []
    for root, dirs, names in os.walk(model_dir, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        out += [Path(root) / n for n in sorted(names)]
    return out


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


class HashCache:
    """SHA-256 of large files keyed by real path, size, mtime and inode (what DVC's own
    state database keys on): a file is read again only when one of those changed."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[str, Any] = {}
        if path is not None and path.is_file():
            try:
                self.entries = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                self.entries = {}  # unreadable: rebuilt, never trusted
        self.dirty = False

    def sha256(self, path: Path, st: os.stat_result) -> str:
        key = str(path.resolve())
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        hit = self.entries.get(key)
        if isinstance(hit, dict) and hit.get("stat") == stamp:
            return str(hit["sha256"])
        digest = sha256_file(path)
        self.entries[key] = {"stat": stamp, "sha256": digest}
        self.dirty = True
        return digest

    def save(self) -> None:
        if self.path is not None and self.dirty:
            atomic_write_json(self.path, self.entries)


def fingerprint_dir(
    model_dir: Path, mode: str = "stat", cache_file: Path | None = None
) -> dict[str, Any]:
    """Every file of ``model_dir`` (relative path -> what identifies its content)."""
    cache = HashCache(cache_file if mode == "content" else None)
    files = {
        p.relative_to(model_dir).as_posix(): _entry(p, str(mode), cache) for p in _files(model_dir)
    }
    cache.save()
    return {"dir": str(model_dir.resolve()), "mode": str(mode), "files": files}


def fingerprint_file(
    path: Path, mode: str = "stat", cache_file: Path | None = None
) -> dict[str, Any]:
    """One file (a GGUF target), in the same form as :func:`fingerprint_dir`."""
    cache = HashCache(cache_file if mode == "content" else None)
    entry = _entry(path, str(mode), cache)
    cache.save()
    return {"dir": str(path.parent.resolve()), "mode": str(mode), "files": {path.name: entry}}


def _entry(path: Path, mode: str, cache: HashCache) -> dict[str, Any]:
    """What identifies one file: small ones by content, weights by stat or content."""
    st = path.stat()
    large = path.name.endswith(WEIGHT_SUFFIXES) or st.st_size > SMALL_FILE_BYTES
    if not large:
        return {"sha256": sha256_file(path)}
    if mode == "content":
        return {"size": st.st_size, "sha256": cache.sha256(path, st)}
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
