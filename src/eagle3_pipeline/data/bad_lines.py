"""The bad-lines report: every input record the prepare stage could not use, one JSON
object a line (``where``, ``reason``, ``message``).

Why a file and not the log: the log names the first few; a user fixing a 100k-line file
needs all of them in one pass, in a form they can grep or load. The report is written on
success and on failure alike (empty when the input is clean), before the stage decides.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from eagle3_pipeline.core.io import atomic_write_text
from eagle3_pipeline.data.bad_input import ErrorLog

log = logging.getLogger(__name__)


def write_bad_lines(errors: ErrorLog, path: Path) -> None:
    """Write the report atomically and log its one-line summary."""
    text = "".join(json.dumps(e.to_dict()) + "\n" for e in errors.entries)
    atomic_write_text(path, text)
    if errors.entries:
        log.warning("data: %s; every one is listed in %s", errors.summary(), path)
