"""Fingerprints of the target's tokenizer and weights.

Hidden states are only comparable when the same tokenizer produced the token ids and the
same weights produced the states; these hashes go into the manifest so files of another
target are never mixed in, and let a prepared dataset of another tokenizer be refused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from eagle3_pipeline.core.config import ConfigError
from eagle3_pipeline.core.errors import StageError

# Tokenizer files whose bytes define the token ids (the fingerprint a prepared dataset
# and the hidden states must share).
TOKENIZER_PATTERNS = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "*.tiktoken",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "added_tokens.json",
)
# Hash every weight byte up to this total; beyond it, a sampled fingerprint (size + the
# first and last MiB of each shard) keeps a 1T target from costing an hour of hashing.
FULL_WEIGHT_HASH_LIMIT = 2 << 30


def _sha256_files(files: Sequence[Path], root: Path) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(partial(fh.read, 1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def tokenizer_sha256(model_dir: Path) -> str:
    """Fingerprint of the tokenizer files: two datasets tokenized by tokenizers with the
    same fingerprint have comparable token ids. The prepare stage should record the same
    value (key ``tokenizer_sha256``) so a dataset from another tokenizer is refused."""
    files = sorted({f for pat in TOKENIZER_PATTERNS for f in Path(model_dir).glob(pat)})
    if not files:
        raise ConfigError(f"{model_dir}: no tokenizer files ({', '.join(TOKENIZER_PATTERNS)})")
    return _sha256_files(files, Path(model_dir))


def weights_fingerprint(model_dir: Path) -> str:
    """What identifies the target's weights when no pinned revision does (a locally built
    or fine-tuned target): its config plus its weight bytes (sampled above 2 GiB)."""
    model_dir = Path(model_dir)
    shards = sorted(model_dir.glob("*.safetensors"))
    total = sum(f.stat().st_size for f in shards)
    h = hashlib.sha256()
    cfg = model_dir / "config.json"
    if cfg.is_file():
        h.update(cfg.read_bytes())
    method = "full" if total <= FULL_WEIGHT_HASH_LIMIT else "sampled"
    for f in shards:
        size = f.stat().st_size
        h.update(f"{f.name}:{size}\0".encode())
        with open(f, "rb") as fh:
            if method == "full":
                for chunk in iter(partial(fh.read, 1 << 20), b""):
                    h.update(chunk)
            else:
                h.update(fh.read(1 << 20))
                fh.seek(max(0, size - (1 << 20)))
                h.update(fh.read())
    return f"{method}:{h.hexdigest()}"


def check_prepared_tokenizer(path: Path, expected: str) -> None:
    """Refuse a prepared dataset that records a different tokenizer fingerprint (any
    top-level JSON file of the prepared directory with a ``tokenizer_sha256`` key)."""
    for f in sorted(Path(path).glob("*.json")):
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        got = data.get("tokenizer_sha256") if isinstance(data, dict) else None
        if got is not None and got != expected:
            raise StageError(
                f"{f}: tokenizer_sha256 {str(got)[:12]}... != the target's tokenizer "
                f"{expected[:12]}...: the prepared rows come from another tokenizer; rerun "
                f"the prepare stage for this target"
            )
