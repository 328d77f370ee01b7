"""Where extraction reads and writes, and what a hidden-state file is called.

One file per prepared row i, ``hs_{i}.safetensors``: ``token_ids`` int64 ``[seq]`` (equal to
the row's ``input_ids``, or speculators silently drops the sample) and ``hidden_states``
``[seq, n_aux + 1, hidden]``: the residual stream entering each aux layer k (= HF
``hidden_states[k]``), then the final hidden state BEFORE the final norm (the trainer applies
the verifier's norm and lm_head itself). Capturing ``output_hidden_states[-1]`` instead would
be silently wrong: in transformers 5 it is after the norm.

Names live here so the writer, the resume logic and both backends agree on them: a file
one of them names differently would be invisible to the others.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from eagle3_pipeline.extract.view import ExtractInputs

FORMAT = "speculators-hidden-states/1"
MANIFEST = "manifest.json"
FILE_RE = re.compile(r"^hs_(\d+)\.safetensors$")
# Temp files of an atomic write (see :func:`temp_path`); a killed run leaves them behind.
TMP_GLOB = ".hs_*.tmp"


def target_json_path(cfg: ExtractInputs) -> Path:
    return Path(cfg.paths.target) / "target.json"


def prepared_rows_dir(cfg: ExtractInputs) -> Path:
    return Path(cfg.paths.prepared)


def output_dir(cfg: ExtractInputs) -> Path:
    return Path(cfg.paths.hidden_states)


def hs_path(out: Path, row: int) -> Path:
    return out / f"hs_{row}.safetensors"


def temp_path(path: Path) -> Path:
    """A per-process temp name in the same directory (so the final move is a rename),
    matched by :data:`TMP_GLOB` so a later run can remove it."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")
