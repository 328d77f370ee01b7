"""Shapes and dtypes of a safetensors file without reading tensor data.

Built on ``safetensors.safe_open``, which validates the header against the file size, so
a truncated or foreign file is reported as such instead of being half-read. Used for
weight names of targets (including config-only replicas), for resuming hidden-state files
and for checking draft checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eagle3_pipeline.core.errors import ConfigError


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's header entry: safetensors dtype name (``F32``, ``BF16``, ...) and shape."""

    dtype: str
    shape: tuple[int, ...]


def read_header(path: str | Path) -> dict[str, TensorInfo]:
    """Every tensor of ``path`` by name; :class:`ConfigError` naming the file if it is not
    a complete safetensors file."""
    from safetensors import safe_open

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: safetensors file not found")
    try:
        with safe_open(str(p), framework="numpy") as fh:
            out: dict[str, TensorInfo] = {}
            for name in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
                sl = fh.get_slice(name)
                out[name] = TensorInfo(sl.get_dtype(), tuple(int(d) for d in sl.get_shape()))
    except ConfigError:
        raise
    except Exception as exc:  # safetensors raises its own SafetensorError / OSError
        raise ConfigError(f"{p}: not a complete safetensors file ({exc})") from None
    return out


def tensor_names(path: str | Path) -> list[str]:
    return sorted(read_header(path))
