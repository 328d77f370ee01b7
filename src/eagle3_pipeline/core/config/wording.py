"""How a composition error is worded: one line naming the key and the problem, from
Hydra's and OmegaConf's multi-line errors, with the closest key when one is mistyped.

Text for people only: an error stops the stage before it writes anything, so no output
depends on this wording; it is not a code dep of any stage (``eagle3-graph``'s
``TEXT_ONLY``) and rewording it reruns nothing.
"""

from __future__ import annotations

from typing import Any

from eagle3_pipeline.core.config.schema import Config


def compose_error_line(exc: BaseException) -> str:
    """One line naming the key and the problem, from Hydra/OmegaConf's multi-line errors
    (here and in the DVC hook, :mod:`eagle3_pipeline.compat.dvc`).

    The key is kept from OmegaConf's ``full_key:`` line when no other line names it (a bad
    value in a group file or a params file: only the ``full_key`` line says where)."""
    parts: list[str] = []
    keys: list[str] = []
    seen: BaseException | None = exc
    while seen is not None:
        lines = [ln.strip() for ln in str(seen).strip().splitlines() if ln.strip()]
        for ln in lines:
            if ln.startswith("full_key:"):
                keys.append(ln.removeprefix("full_key:").strip())
                continue
            if ln.startswith(("reference_type=", "object_type=", "To append")):
                continue
            if ln.startswith(("Config search path", "provider=")):
                break
            parts.append(ln.rstrip(".:"))
        seen = seen.__cause__
    text = "; ".join(dict.fromkeys(p for p in parts if p))
    text = text.replace("Available options in", "available options in").replace(";\t", ", ")
    key = next((k for k in keys if k), None)
    line = f"{key}: {text}" if key and key not in text else text
    if key and "not in" in text and (close := _close_key(key)):
        line += f" (did you mean {close}?)"
    return line


def _close_key(full_key: str) -> str | None:
    """The schema key closest to a mistyped ``full_key`` (``train.epocs`` -> ``train.epochs``)."""
    import difflib

    from omegaconf import DictConfig, OmegaConf

    parent, _, leaf = full_key.rpartition(".")
    node: Any = OmegaConf.structured(Config)
    for part in parent.split(".") if parent else []:
        node = node.get(part) if isinstance(node, DictConfig) else None
    if not isinstance(node, DictConfig):
        return None
    close = difflib.get_close_matches(leaf, [str(k) for k in node.keys()], n=1, cutoff=0.6)
    return f"{parent}.{close[0]}" if parent and close else (close[0] if close else None)
