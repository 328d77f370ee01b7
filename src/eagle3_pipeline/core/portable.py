"""Commands recorded in artifacts, with this workspace's absolute prefix removed.

Why: the validate stage's report, its model card and its details record the exact
``vllm serve`` lines it ran, which hold absolute paths (engines get absolute paths so that
a server's working directory does not matter). Those artifacts travel: the details are
git-versioned, the report goes through the DVC remote to every clone. A line that reads
``/home/alice/eagle3/data/draft`` on Bob's machine is wrong there; ``data/draft`` is right
wherever the pipeline's root is the working directory, as it is for every stage and for
the commands the docs print.
"""

from __future__ import annotations

import os
from pathlib import Path


def portable(text: str, root: str | Path | None = None) -> str:
    """``text`` with ``root`` (the working directory when None) and its separator removed
    wherever a path starts with it; a path outside ``root`` stays absolute."""
    base = os.path.abspath(root if root is not None else os.getcwd())
    if base == os.sep:
        return text
    return text.replace(base + os.sep, "")
