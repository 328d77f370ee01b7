"""Byte units, dtype sizes and the way the plan prints sizes and durations.

One module so that preflight's disk message and the plan's report print the same figure
the same way (decimal GB for disk, as ``df -H`` and cloud quotas show; GiB for memory).
"""

from __future__ import annotations

GB = 1000**3
GIB = 1024**3
MIB = 1024**2

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# Every hidden-state file stores the row's token ids (int64) next to the states.
TOKEN_ID_BYTES = 8
ADAM_STATE_BYTES = 8  # two fp32 moments per trainable parameter


def fmt_gb(n: float) -> str:
    """Disk sizes in decimal GB (what ``df -H`` and cloud quotas show)."""
    if n < GB:
        return f"{n / 1000**2:,.1f} MB"
    return f"{n / GB:,.1f} GB" if n < 100 * GB else f"{n / GB:,.0f} GB"


def fmt_gib(n: float) -> str:
    return f"{n / GIB:,.1f} GiB"


def fmt_duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
