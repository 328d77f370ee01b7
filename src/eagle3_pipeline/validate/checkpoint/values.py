"""The value rules: no NaN/Inf in any float tensor, and a ``d2t`` vLLM can scatter by.

Reads raw bytes with numpy through a memory map, one tensor and one chunk at a time, so a
large target's draft with a multi-GB embedding is checked in bounded memory and without
importing torch. ``safe_open(framework="numpy")`` cannot hand out bf16 tensors (numpy has
no bf16), which is why the bytes are read here: :func:`byte_ranges` is the one place that
locates them, :func:`_view` the one place that reads them.
"""

from __future__ import annotations

import contextlib
import math
import mmap
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.safetensors import TensorInfo, read_header
from eagle3_pipeline.validate.checkpoint.report import Report
from eagle3_pipeline.validate.checkpoint.weights import StoredTensor, vllm_name

# numpy dtypes for the safetensors dtypes read raw; BF16 is widened by hand (numpy has none).
_NUMPY_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "BOOL": "?",
}
_FLOAT_VALUES = ("F64", "F32", "F16", "BF16")
# Bits per element of every safetensors dtype, values read or not: a tensor's position
# depends on the sizes of all tensors stored before it.
_DTYPE_BITS = {
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
}
_CHUNK = 1 << 24  # elements per NaN/Inf pass: bounds memory on a multi-GB embedding


# --------------------------------------------------------------------------- raw bytes


def byte_ranges(path: Path) -> dict[str, tuple[int, int]]:
    """Absolute ``[start, end)`` byte range of every tensor in ``path``.

    Derived rather than parsed: safetensors -- which validated the file in
    :func:`read_header` -- requires the tensors to be stored back to back in offset order,
    without holes, the last one ending at the end of the file. Each range therefore
    follows from the offset order, the dtypes and shapes, and the file size.
    """
    from safetensors import safe_open

    header = read_header(path)
    with safe_open(str(path), framework="numpy") as fh:
        order = list(fh.offset_keys())
    sizes = [_nbytes(name, header[name]) for name in order]
    pos = path.stat().st_size - sum(sizes)
    ranges: dict[str, tuple[int, int]] = {}
    for name, size in zip(order, sizes, strict=True):
        ranges[name] = (pos, pos + size)
        pos += size
    return ranges


def _nbytes(name: str, info: TensorInfo) -> int:
    bits = _DTYPE_BITS.get(info.dtype)
    if bits is None:
        raise ValueError(f"{name}: dtype {info.dtype} unknown, tensor offsets not derivable")
    return math.prod(info.shape) * bits // 8


def _view(mm: mmap.mmap, span: tuple[int, int], dtype: str) -> Any:
    """The tensor's elements as a numpy view on the map (BF16 as raw uint16)."""
    import numpy as np

    start, end = span
    dt = np.dtype(_NUMPY_DTYPES[dtype])
    return np.frombuffer(mm, dtype=dt, count=(end - start) // dt.itemsize, offset=start)


def _count_nonfinite(values: Any, dtype: str) -> int:
    import numpy as np

    bad = 0
    for i in range(0, values.size, _CHUNK):
        chunk = values[i : i + _CHUNK]
        if dtype == "BF16":
            chunk = (chunk.astype(np.uint32) << 16).view(np.float32)
        bad += int(chunk.size - np.isfinite(chunk).sum())
    return bad


# --------------------------------------------------------------------------- rules


def check_tensor_values(
    report: Report,
    draft_dir: Path,
    by_vllm: dict[str, StoredTensor],
    target_vocab: int | None,
) -> None:
    """NaN/Inf in float tensors; d2t offsets inside the target vocabulary, no duplicates."""
    by_file: dict[str, list[StoredTensor]] = {}
    for info in by_vllm.values():
        by_file.setdefault(info.file, []).append(info)
    vocab_maps: dict[str, Any] = {}  # "d2t" / "t2d" -> values, wherever they are stored
    for fname, infos in sorted(by_file.items()):
        _scan_file(report, draft_dir / fname, infos, vocab_maps)
    if "d2t" in vocab_maps:
        _check_d2t(report, vocab_maps["d2t"], vocab_maps.get("t2d"), target_vocab)


def _scan_file(
    report: Report, path: Path, infos: list[StoredTensor], vocab_maps: dict[str, Any]
) -> None:
    try:
        ranges = byte_ranges(path)
        with open(path, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except Exception as exc:  # noqa: BLE001 - an unreadable file is one finding
        report.error("weights-unreadable", path.name, f"cannot open ({exc})")
        return
    try:
        for info in sorted(infos, key=lambda i: i.name):
            _scan_tensor(report, mm, ranges[info.name], info, vocab_maps)
    finally:
        with contextlib.suppress(BufferError):  # a view still alive: GC closes it
            mm.close()


def _scan_tensor(
    report: Report,
    mm: mmap.mmap,
    span: tuple[int, int],
    info: StoredTensor,
    vocab_maps: dict[str, Any],
) -> None:
    where = f"{info.file}:{info.name}"
    if info.dtype not in _NUMPY_DTYPES:
        report.warning("tensor-dtype", where, f"{info.dtype}: values not checked")
        return
    name = vllm_name(info.name)
    try:
        if info.dtype in _FLOAT_VALUES:
            bad = _count_nonfinite(_view(mm, span, info.dtype), info.dtype)
            if bad:
                n = max(1, math.prod(info.shape))
                report.error("nonfinite", where, f"{bad} of {n} values are NaN/Inf")
        elif name == "d2t":
            vocab_maps["d2t"] = _view(mm, span, info.dtype).copy()
        elif name == "t2d":
            vocab_maps["t2d"] = _view(mm, span, info.dtype).astype(bool)
    except (ValueError, TypeError) as exc:
        report.error("weights-unreadable", where, f"cannot read ({exc})")


def _check_d2t(report: Report, d2t: Any, t2d: Any, target_vocab: int | None) -> None:
    """vLLM scatters draft logits to ``i + d2t[i]``: every id must land in the target
    vocabulary, and no two on the same id."""
    import numpy as np

    if d2t.ndim != 1 or d2t.dtype.kind not in "iu":
        return  # shape/dtype already reported
    ids = np.arange(d2t.size, dtype=np.int64) + d2t.astype(np.int64)
    if target_vocab is not None:
        bad = np.flatnonzero((ids < 0) | (ids >= target_vocab))
        if bad.size:
            i = int(bad[0])
            report.error(
                "d2t-range",
                "d2t",
                f"{bad.size} offsets leave the target vocabulary [0, {target_vocab}): "
                f"first at draft id {i}: {i} + d2t[{i}] = {int(ids[i])}",
            )
    n_unique = np.unique(ids).size
    if n_unique != ids.size:
        report.error(
            "d2t-duplicate",
            "d2t",
            f"{ids.size - n_unique} draft ids map to a target id already taken: "
            "vLLM scatters logits by these ids, so one draft token would be lost",
        )
    if t2d is not None and t2d.ndim == 1:
        valid = ids[(ids >= 0) & (ids < t2d.size)]
        if int(t2d.sum()) != d2t.size or not bool(t2d[valid].all()):
            report.warning(
                "t2d",
                "t2d",
                "does not mark exactly the target ids d2t maps to "
                "(vLLM ignores t2d; speculators uses it to slice the verifier lm_head)",
            )
