"""The prepared rows as extraction sees them: checked once, hashed, read by index.

Every row is checked before any batch runs, so a bad row fails the stage in seconds
instead of after hours of forwards; the hashes let the manifest tell whether existing
files were extracted from these rows (or from a prefix of them).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.errors import StageError

CHUNK_ROWS = 1024  # rows read from the arrow data at a time while checking


@dataclass
class Rows:
    """The prepared dataset's rows as extraction sees them (the arrow data stays on disk)."""

    path: Path
    dataset: Any  # datasets.Dataset with numpy format
    lengths: list[int]
    sha256: str  # over every row's input_ids, in order
    prefix_sha256: dict[int, str] = field(default_factory=dict)  # n -> hash of rows[:n]

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    def input_ids(self, rows: Sequence[int]) -> list[Any]:
        import numpy as np

        got = self.dataset[list(rows)]["input_ids"]
        return [np.asarray(x, dtype=np.int64) for x in got]


def _row_bytes(ids: Any) -> bytes:
    import numpy as np

    arr = np.asarray(ids, dtype="<i8")
    return struct.pack("<q", arr.shape[0]) + arr.tobytes()


def _open_dataset(path: Path) -> Any:
    """The prepared dataset in numpy format; StageError when it is missing, not a
    ``save_to_disk`` directory, without ``input_ids`` or empty."""
    from datasets import load_from_disk

    if not path.is_dir():
        raise StageError(f"{path}: prepared dataset not found (run the prepare stage)")
    try:
        ds = load_from_disk(str(path))
    except Exception as exc:  # not a save_to_disk directory
        raise StageError(f"{path}: not a datasets save_to_disk directory ({exc})") from None
    if "input_ids" not in ds.column_names:
        raise StageError(f"{path}: no input_ids column (columns: {ds.column_names})")
    ds = ds.with_format("numpy")
    if len(ds) == 0:
        raise StageError(f"{path}: the prepared dataset has no rows")
    return ds


def _checked_row(path: Path, row: int, ids: Any, seq_len: Any, vocab_size: int) -> Any:
    """Row ``row``'s ids as int64, or StageError naming what is wrong with it."""
    import numpy as np

    try:
        arr = np.asarray(ids, dtype=np.int64)
    except (TypeError, ValueError):
        raise StageError(f"{path}: row {row}: input_ids are not integers") from None
    if arr.ndim != 1 or arr.shape[0] == 0:
        raise StageError(f"{path}: row {row}: input_ids is empty or not 1-D")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= vocab_size:
        raise StageError(
            f"{path}: row {row}: token id {hi if hi >= vocab_size else lo} outside the "
            f"target's vocabulary [0, {vocab_size}): was it tokenized by another "
            f"tokenizer? Rerun the prepare stage for this target"
        )
    if seq_len is not None and int(seq_len) != arr.shape[0]:
        raise StageError(
            f"{path}: row {row}: seq_len {int(seq_len)} != len(input_ids) {arr.shape[0]}"
        )
    return arr


def load_rows(path: Path, vocab_size: int, prefix_at: Sequence[int] = ()) -> Rows:
    """Open the prepared dataset and check every row once (before any batch runs): token
    ids inside the target's vocabulary, ``seq_len`` consistent, no empty row. Hashes the
    rows so a manifest can tell whether existing files belong to these rows."""
    path = Path(path)
    ds = _open_dataset(path)
    n = len(ds)
    wanted = {int(k) for k in prefix_at if 0 < int(k) <= n}
    h = hashlib.sha256()
    lengths: list[int] = []
    prefix: dict[int, str] = {}
    has_seq_len = "seq_len" in ds.column_names
    for start in range(0, n, CHUNK_ROWS):
        chunk = ds[start : start + CHUNK_ROWS]
        seq_lens = chunk["seq_len"] if has_seq_len else None
        for j, ids in enumerate(chunk["input_ids"]):
            row = start + j
            arr = _checked_row(
                path, row, ids, None if seq_lens is None else seq_lens[j], vocab_size
            )
            lengths.append(int(arr.shape[0]))
            h.update(_row_bytes(arr))
            if row + 1 in wanted:
                prefix[row + 1] = h.copy().hexdigest()
    return Rows(path=path, dataset=ds, lengths=lengths, sha256=h.hexdigest(), prefix_sha256=prefix)
