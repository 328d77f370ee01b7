"""transformers' GGUF reader, used where its public API stops.

``from_pretrained(dir, gguf_file=...)`` (public) de-quantises a GGUF checkpoint, but two
things the pipeline needs before spending that time live in transformers' internal
``modeling_gguf_pytorch_utils``:

- the list of GGUF architectures transformers can de-quantise (``GGUF_SUPPORTED_ARCHITECTURES``),
  so an unsupported file is refused by name before anything is loaded;
- the transformers ``config.json`` a GGUF file maps to, read from its metadata alone
  (``load_gguf_checkpoint(path, return_tensors=False)``), so the plan and preflight can
  describe a GGUF target without converting it.

``tests/targets/test_gguf.py`` fails when either moves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def supported_architectures() -> list[str]:
    """GGUF ``general.architecture`` values transformers can de-quantise."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    # the list is the keys of its metadata mapping, which also holds two non-architectures
    return [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]


def config_from_metadata(path: Path) -> dict[str, Any]:
    """The transformers config keys (``model_type``, sizes, ``tie_word_embeddings``) that
    the GGUF file's metadata maps to; no tensor is read."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    parsed = load_gguf_checkpoint(str(path), return_tensors=False)
    return dict(parsed["config"])
