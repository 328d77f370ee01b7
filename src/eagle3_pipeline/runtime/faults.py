"""Test-only fault injection, read from the environment and never from the config.

Resume after a crash is a promise of the pipeline, so tests kill a stage at a chosen point
and rerun it. The switch that chooses the point is an environment variable (inherited by
DVC-run stages and torchrun workers alike), not a product setting in ``params.yaml``: a
user cannot set it by accident and it never changes a stage's params hash.
"""

from __future__ import annotations

import os

PREFIX = "EAGLE3_FAULT_"
# Exit code of an injected hard exit: distinct from real failures (1) and config errors (2).
FAULT_EXIT_CODE = 86


def fault_after(name: str) -> int | None:
    """The count after which the fault ``name`` fires (``EAGLE3_FAULT_<NAME>``), or None."""
    raw = os.environ.get(PREFIX + name.upper())
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{PREFIX}{name.upper()}={raw!r} is not an integer") from None
