"""The two failures a user must act on, raised by the library and shown as one line.

The stage runner (``stages.runner``) turns them into ``error: <stage>: <message>`` and a
non-zero exit; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem a user must fix; its message names the key or file."""


class StageError(RuntimeError):
    """An expected failure of a stage (bad input, failed check); its message is shown as is."""


def rebuild_hint(stage: str) -> str:
    """What a damaged artifact's message ends with: which stage rebuilds it, and how."""
    return f"the {stage} stage rebuilds it: `dvc repro {stage}`"
