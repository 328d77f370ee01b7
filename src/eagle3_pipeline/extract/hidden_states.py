"""Target hidden states in speculators' on-disk format (DESIGN.md section 3).

One file per prepared row i, ``hs_{i}.safetensors``: ``token_ids`` int64 ``[seq]`` (equal to
the row's ``input_ids``, or speculators silently drops the sample) and ``hidden_states``
``[seq, n_aux + 1, hidden]``: the residual stream entering each aux layer k (= HF
``hidden_states[k]``), then the final hidden state BEFORE the final norm (the trainer applies
the verifier's norm and lm_head itself). Capturing ``output_hidden_states[-1]`` instead would
be silently wrong: in transformers 5 it is after the norm.

This module holds what both backends share (the target, the rows, the manifest that keeps
files of different targets/layers/dtypes from being mixed, the file format) and the ``hf``
backend: the target's language model only, batched by length, a writer thread that
serializes while the next batch computes, atomic per-file writes, resume by batch.
The ``vllm`` backend is :mod:`eagle3_pipeline.extract.vllm_backend`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import re
import resource
import shutil
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config import Config, ConfigError
from eagle3_pipeline.core.errors import StageError
from eagle3_pipeline.core.io import atomic_write_json
from eagle3_pipeline.targets.adapter import TargetSpec, load_target_spec, read_safetensors_header
from eagle3_pipeline.targets.loading import LanguageModel, load_language_model

log = logging.getLogger(__name__)

FORMAT = "speculators-hidden-states/1"
MANIFEST = "manifest.json"
FILE_RE = re.compile(r"^hs_(\d+)\.safetensors$")
TMP_GLOB = ".hs_*.tmp"
# Exit code of the test-only fault (``extract.fail_after``): distinct from real failures.
FAULT_EXIT_CODE = 86

# Where a causal LM keeps its decoder stack and final norm, in order of preference.
# Tokenizer files whose bytes define the token ids (the fingerprint a prepared dataset
# and the hidden states must share).
TOKENIZER_PATTERNS = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "*.tiktoken", "vocab.json", "vocab.txt", "merges.txt", "added_tokens.json",
)
# Hash every weight byte up to this total; beyond it, a sampled fingerprint (size + the
# first and last MiB of each shard) keeps a 1T target from costing an hour of hashing.
FULL_WEIGHT_HASH_LIMIT = 2 << 30

_SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
_ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}


# --------------------------------------------------------------------------- paths


def target_json_path(cfg: Config) -> Path:
    return Path(cfg.paths.target) / "target.json"


def prepared_dir(cfg: Config) -> Path:
    return Path(cfg.paths.prepared)


def output_dir(cfg: Config) -> Path:
    return Path(cfg.paths.hidden_states)


def hs_path(out: Path, row: int) -> Path:
    return out / f"hs_{row}.safetensors"


# --------------------------------------------------------------------------- fingerprints


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


# --------------------------------------------------------------------------- rows


@dataclass
class Rows:
    """The prepared dataset's rows as extraction sees them (the arrow data stays on disk)."""

    path: Path
    dataset: Any  # datasets.Dataset with numpy format
    lengths: list[int]
    sha256: str  # over every row's input_ids, in order
    prefix_sha256: dict[int, str] = field(default_factory=dict)  # n -> hash of rows[:n]

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    def input_ids(self, rows: Sequence[int]) -> list[Any]:
        import numpy as np

        got = self.dataset[list(rows)]["input_ids"]
        return [np.asarray(x, dtype=np.int64) for x in got]


def _row_bytes(ids: Any) -> bytes:
    import numpy as np

    arr = np.asarray(ids, dtype="<i8")
    return struct.pack("<q", arr.shape[0]) + arr.tobytes()


def load_rows(path: Path, vocab_size: int, prefix_at: Sequence[int] = ()) -> Rows:
    """Open the prepared dataset and check every row once (before any batch runs): token
    ids inside the target's vocabulary, ``seq_len`` consistent, no empty row. Hashes the
    rows so a manifest can tell whether existing files belong to these rows."""
    import numpy as np
    from datasets import load_from_disk

    path = Path(path)
    if not path.is_dir():
        raise StageError(f"{path}: prepared dataset not found (run the prepare stage)")
    try:
        ds = load_from_disk(str(path))
    except Exception as exc:  # not a save_to_disk directory
        raise StageError(f"{path}: not a datasets save_to_disk directory ({exc})") from None
    if "input_ids" not in ds.column_names:
        raise StageError(f"{path}: no input_ids column (columns: {ds.column_names})")
    ds = ds.with_format("numpy")
    n = len(ds)
    if n == 0:
        raise StageError(f"{path}: the prepared dataset has no rows")
    wanted = {int(k) for k in prefix_at if 0 < int(k) <= n}
    h = hashlib.sha256()
    lengths: list[int] = []
    prefix: dict[int, str] = {}
    has_seq_len = "seq_len" in ds.column_names
    for start in range(0, n, 1024):
        chunk = ds[start : start + 1024]
        seq_lens = chunk["seq_len"] if has_seq_len else None
        for j, ids in enumerate(chunk["input_ids"]):
            row = start + j
            try:
                arr = np.asarray(ids, dtype=np.int64)
            except (TypeError, ValueError):
                raise StageError(f"{path}: row {row}: input_ids are not integers") from None
            if arr.ndim != 1 or arr.shape[0] == 0:
                raise StageError(f"{path}: row {row}: input_ids is empty or not 1-D")
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0 or hi >= vocab_size:
                raise StageError(
                    f"{path}: row {row}: token id {hi if hi >= vocab_size else lo} outside the "
                    f"target's vocabulary [0, {vocab_size}): was it tokenized by another "
                    f"tokenizer? Rerun the prepare stage for this target"
                )
            if seq_lens is not None and int(seq_lens[j]) != arr.shape[0]:
                raise StageError(
                    f"{path}: row {row}: seq_len {int(seq_lens[j])} != len(input_ids) "
                    f"{arr.shape[0]}"
                )
            lengths.append(int(arr.shape[0]))
            h.update(_row_bytes(arr))
            if row + 1 in wanted:
                prefix[row + 1] = h.copy().hexdigest()
    return Rows(path=path, dataset=ds, lengths=lengths, sha256=h.hexdigest(), prefix_sha256=prefix)


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


# --------------------------------------------------------------------------- batch plan


def plan_batches(lengths: Sequence[int], batch_tokens: int, plan_rows: int) -> list[list[int]]:
    """Length-bucketed batches, padding-aware: ``len(batch) * longest row <= batch_tokens``
    (a row longer than the budget is a batch of its own).

    A pure function of the row lengths, so a resumed run processes exactly the batches
    the interrupted one did (same padding, bitwise-equal files). Rows are sorted within
    consecutive segments of ``plan_rows`` rows, so appending rows (train.samples N -> M)
    leaves every batch of the earlier full segments unchanged."""
    if batch_tokens < 1 or plan_rows < 1:
        raise ConfigError("extract.batch_tokens and extract.plan_rows must be >= 1")
    batches: list[list[int]] = []
    n = len(lengths)
    for seg in range(0, n, plan_rows):
        order = sorted(range(seg, min(n, seg + plan_rows)), key=lambda i: (-lengths[i], i))
        cur: list[int] = []
        longest = 0
        for i in order:
            grown = max(longest, lengths[i])
            if cur and grown * (len(cur) + 1) > batch_tokens:
                batches.append(cur)
                cur, grown = [], lengths[i]
            cur.append(i)
            longest = grown
        if cur:
            batches.append(cur)
    return batches


def rank_batches(plan: list[list[int]], rank: int, world_size: int) -> list[tuple[int, list[int]]]:
    """This process's share: batches ``j % world_size == rank`` (round robin, so every
    rank gets long and short batches alike)."""
    return [(j, b) for j, b in enumerate(plan) if j % world_size == rank]


# --------------------------------------------------------------------------- manifest


def manifest_key(
    spec: TargetSpec, model_dir: Path, dtype: str, backend: str, tok_sha: str
) -> dict[str, Any]:
    """Everything that makes two hidden-state files incompatible. Files are only ever
    added to a directory whose manifest carries exactly this key."""
    pinned = bool(spec.hub_id and spec.revision)
    return {
        "format": FORMAT,
        "backend": backend,
        "target": {
            "name": spec.name,
            "hub_id": spec.hub_id,
            "revision": spec.revision,
            "architecture": spec.architecture,
            "num_layers": spec.num_layers,
            "hidden_size": spec.hidden_size,
            "vocab_size": spec.vocab_size,
            "weights": None if pinned else weights_fingerprint(model_dir),
        },
        "tokenizer_sha256": tok_sha,
        "layers": {
            "aux_layer_ids": list(spec.aux_layer_ids),
            "final": "before_final_norm",
            "layout": "hidden_states[:, :n_aux] = aux layers in order; [:, -1] = final",
        },
        "hidden_size": spec.hidden_size,
        "dtype": dtype,
    }


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [f"{prefix.rstrip('.')}: {a!r} (files) != {b!r} (now)"]


def existing_files(out: Path) -> dict[int, Path]:
    found: dict[int, Path] = {}
    if out.is_dir():
        for f in out.iterdir():
            m = FILE_RE.match(f.name)
            if m:
                found[int(m.group(1))] = f
    return found


def check_manifest(
    out: Path, key: dict[str, Any], rows: Rows, on_mismatch: str
) -> dict[int, Path]:
    """Decide what existing files may be reused; refuse (or, with
    ``on_mismatch=restart``, delete) files of another target/revision/layers/dtype or of
    rows that are neither a prefix nor an extension of these. Returns the reusable files."""
    files = existing_files(out)
    mpath = out / MANIFEST
    problems: list[str] = []
    if mpath.is_file():
        try:
            old = json.loads(mpath.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise StageError(f"{mpath}: not valid JSON ({exc})") from None
        problems = _diff({k: old.get(k) for k in key}, key)
        samples = old.get("samples") or {}
        n_old = int(samples.get("count", 0))
        if not problems and 0 < n_old <= len(rows):
            if rows.prefix_sha256.get(n_old) != samples.get("input_ids_sha256"):
                problems.append(
                    f"samples: rows 0..{n_old - 1} differ from the {n_old} rows the files were "
                    f"extracted from (input_ids hash)"
                )
    elif files:
        problems.append(f"{len(files)} hs_*.safetensors files but no {MANIFEST}")
    if not problems:
        return files
    if on_mismatch == "restart":
        log.warning("%s: discarding %d files: %s", out, len(files), "; ".join(problems))
        for f in files.values():
            f.unlink()
        mpath.unlink(missing_ok=True)
        return {}
    raise StageError(
        f"{out}: existing hidden states do not match this extraction ({'; '.join(problems)}); "
        f"files are never mixed: remove {out} or set extract.on_mismatch=restart"
    )


def write_manifest(out: Path, key: dict[str, Any], rows: Rows, extra: dict[str, Any]) -> None:
    """Deterministic content (no timestamps): every rank writes the same bytes."""
    data = dict(key)
    data["samples"] = {"count": len(rows), "tokens": rows.tokens, "input_ids_sha256": rows.sha256}
    data.update(extra)
    atomic_write_json(out / MANIFEST, data)


def file_matches(path: Path, length: int, n_layers: int, hidden: int, dtype: str) -> bool:
    """A cheap header check (no tensor data read) that an existing file is complete and of
    the expected shape; anything else is redone."""
    try:
        header = read_safetensors_header(path)
        tok, hs = header["token_ids"], header["hidden_states"]
        end = max(v["data_offsets"][1] for v in header.values())
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
        return (
            tok["dtype"] == "I64"
            and tok["shape"] == [length]
            and hs["shape"] == [length, n_layers, hidden]
            and _SAFETENSORS_DTYPES.get(hs["dtype"]) == dtype
            and path.stat().st_size == 8 + n + end
        )
    except (OSError, KeyError, ValueError, ConfigError, TypeError):
        return False


def remove_stale_temps(out: Path) -> int:
    """Temp files of a killed run (a hard kill runs no cleanup)."""
    n = 0
    for f in out.glob(TMP_GLOB):
        f.unlink(missing_ok=True)
        n += 1
    return n


# --------------------------------------------------------------------------- writing


@dataclass
class Timings:
    forward_s: float = 0.0
    capture_s: float = 0.0
    serialize_s: float = 0.0
    fsync_s: float = 0.0
    queue_wait_s: float = 0.0
    bytes_written: int = 0
    files_written: int = 0


def save_hidden_states(
    path: Path, token_ids: Any, hidden_states: Any, fsync: bool, timings: Timings | None = None
) -> int:
    """Write one file atomically (temp name in the same directory, fsync, rename); return
    its size. A crash at any point leaves either no file or a complete one."""
    from safetensors.torch import save_file

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        t0 = time.perf_counter()
        save_file({"token_ids": token_ids, "hidden_states": hidden_states}, str(tmp))
        t1 = time.perf_counter()
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        t2 = time.perf_counter()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    size = path.stat().st_size
    if timings is not None:
        timings.serialize_s += t1 - t0
        timings.fsync_s += t2 - t1
        timings.bytes_written += size
        timings.files_written += 1
    return size


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_STOP = object()


class BatchWriter:
    """A thread that writes finished batches while the next one computes.

    The queue holds at most ``depth`` batches, so memory stays bounded by the model plus
    a few batches whatever the dataset size. An error in the writer surfaces in the main
    thread at the next :meth:`put` or at :meth:`close`."""

    def __init__(
        self, out: Path, depth: int, fsync: bool, timings: Timings, fail_after: int | None = None
    ) -> None:
        self.out = out
        self.fsync = fsync
        self.timings = timings
        self.fail_after = fail_after
        self.batches_done = 0
        self.error: BaseException | None = None
        self._q: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
        self._abort = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hs-writer", daemon=True)
        self._thread.start()

    def put(self, items: list[tuple[int, Any, Any]]) -> None:
        t0 = time.perf_counter()
        while True:
            self._raise_if_failed()
            try:
                self._q.put(items, timeout=0.2)
                break
            except queue.Full:
                continue
        self.timings.queue_wait_s += time.perf_counter() - t0

    def close(self) -> None:
        """Flush everything queued, stop the thread, re-raise a writer error."""
        while self._thread.is_alive():
            self._raise_if_failed()
            try:
                self._q.put(_STOP, timeout=0.2)
                break
            except queue.Full:
                continue
        self._thread.join()
        self._raise_if_failed()

    def abort(self) -> None:
        """Stop after the file being written (complete files stay; they are resumable)."""
        self._abort.set()
        with contextlib.suppress(queue.Full):
            self._q.put_nowait(_STOP)
        self._thread.join(timeout=60)

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            err = self.error
            if isinstance(err, OSError):
                raise StageError(f"{self.out}: writing hidden states failed: {err}") from err
            raise err

    def _run(self) -> None:
        try:
            while not self._abort.is_set():
                items = self._q.get()
                if items is _STOP:
                    return
                if self.fail_after is not None and self.batches_done == self.fail_after:
                    self._die_mid_batch(items)
                for row, tok, hs in items:
                    if self._abort.is_set():
                        return
                    save_hidden_states(hs_path(self.out, row), tok, hs, self.fsync, self.timings)
                if self.fsync:
                    fsync_dir(self.out)
                self.batches_done += 1
        except BaseException as exc:  # surfaced in the main thread
            self.error = exc

    def _die_mid_batch(self, items: list[tuple[int, Any, Any]]) -> None:
        """The test-only fault: half of this batch written, a file cut mid-write, then a
        hard exit that runs no cleanup -- what a kill or power cut leaves behind."""
        from safetensors.torch import save

        half = items[: len(items) // 2]
        for row, tok, hs in half:
            save_hidden_states(hs_path(self.out, row), tok, hs, self.fsync, self.timings)
        if len(half) < len(items):
            row, tok, hs = items[len(half)]
            data = save({"token_ids": tok, "hidden_states": hs})
            tmp = self.out / f".hs_{row}.safetensors.{os.getpid()}.tmp"
            tmp.write_bytes(data[: len(data) // 2])
        log.error("extract.fail_after=%d: injected fault, exiting", self.fail_after)
        logging.shutdown()
        os._exit(FAULT_EXIT_CODE)


# --------------------------------------------------------------------------- the target



class Capture:
    """Forward pre-hooks: the input of decoder layer k is the residual stream entering it
    (aux id k); the input of the final norm is the final hidden state before the norm."""

    def __init__(self, lm: LanguageModel, aux_layer_ids: Sequence[int]) -> None:
        self.n = len(aux_layer_ids) + 1
        self.store: dict[int, Any] = {}
        self._handles = [
            lm.layers[k].register_forward_pre_hook(partial(self._hook, pos), with_kwargs=True)
            for pos, k in enumerate(aux_layer_ids)
        ]
        self._handles.append(
            lm.norm.register_forward_pre_hook(partial(self._hook, self.n - 1), with_kwargs=True)
        )

    def _hook(self, pos: int, _module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.store[pos] = args[0] if args else kwargs["hidden_states"]

    def take(self) -> Any:
        """``[batch, seq, n_aux + 1, hidden]`` of the last forward."""
        import torch

        missing = [p for p in range(self.n) if p not in self.store]
        if missing:
            raise StageError(f"capture hooks did not fire for positions {missing}")
        out = torch.stack([self.store[p].to(self.store[self.n - 1].device) for p in range(self.n)], 2)
        self.store.clear()
        return out

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def forward_batch(lm: LanguageModel, seqs: Sequence[Any], pad_id: int) -> tuple[Any, Any]:
    """Right-padded forward of the decoder (no lm_head: extraction never needs logits).
    Right padding leaves every real token's causal context, positions and so its hidden
    states unchanged."""
    import torch

    longest = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), longest), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.as_tensor(s)
        mask[b, : len(s)] = 1
    out = lm.decoder(
        input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device), use_cache=False
    )
    return out.last_hidden_state, ids


# --------------------------------------------------------------------------- the stage


@dataclass
class Extraction:
    """Everything checked before the first batch (shared by both backends)."""

    spec: TargetSpec
    model_dir: Path
    rows: Rows
    out: Path
    key: dict[str, Any]
    reusable: dict[int, Path]
    created_out: bool


def _check_layers(spec: TargetSpec, cfg: Config) -> None:
    ids = list(spec.aux_layer_ids)
    bad = [k for k in ids if not (isinstance(k, int) and 0 <= k < spec.num_layers)]
    if not ids or bad or len(set(ids)) != len(ids):
        raise StageError(
            f"target.json: aux_layer_ids={ids} invalid for a {spec.num_layers}-layer target "
            f"(distinct ids in 0..{spec.num_layers - 1}; id k is the residual stream entering "
            f"layer k): rerun the target stage with a valid model.aux_layer_ids"
        )
    if cfg.model.aux_layer_ids is not None and list(cfg.model.aux_layer_ids) != ids:
        raise StageError(
            f"model.aux_layer_ids={list(cfg.model.aux_layer_ids)} differs from target.json "
            f"{ids}: rerun the target stage (target.json is the one place they are resolved)"
        )


def _check_config(cfg: Config) -> None:
    e = cfg.extract
    if not 0 <= e.rank < e.world_size:
        raise ConfigError(f"extract.rank={e.rank} must be in [0, extract.world_size={e.world_size})")
    if e.on_mismatch not in ("refuse", "restart"):
        raise ConfigError(f"extract.on_mismatch={e.on_mismatch!r} is not one of refuse, restart")
    if e.batch_tokens < 1 or e.plan_rows < 1 or e.writer_queue < 1:
        raise ConfigError("extract.batch_tokens, plan_rows and writer_queue must be >= 1")


def _prepare_output(out: Path) -> bool:
    """Create the output directory and prove it is writable; True when created here."""
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write_probe.{os.getpid()}.tmp"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise StageError(f"{out}: output directory is not writable ({exc.strerror or exc})") from None
    return created


def begin(cfg: Config, backend: str) -> Extraction:
    """Every check that can fail before a model is loaded or a file is written."""
    _check_config(cfg)
    spec = load_target_spec(target_json_path(cfg))
    _check_layers(spec, cfg)
    model_dir = Path(spec.path or "")
    if not model_dir.is_dir():
        raise StageError(f"target.json: path={spec.path}: model directory not found")
    tok_sha = tokenizer_sha256(model_dir)
    check_prepared_tokenizer(prepared_dir(cfg), tok_sha)
    out = output_dir(cfg)
    old_count = _manifest_count(out)
    rows = load_rows(prepared_dir(cfg), spec.vocab_size, prefix_at=[old_count] if old_count else [])
    created = _prepare_output(out)
    remove_stale_temps(out)
    key = manifest_key(spec, model_dir, cfg.extract.dtype, backend, tok_sha)
    try:
        reusable = check_manifest(out, key, rows, cfg.extract.on_mismatch)
        if old_count > len(rows):  # back to fewer rows: the prefix hash cannot tell
            verify_token_ids(rows, reusable)
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    return Extraction(spec, model_dir, rows, out, key, reusable, created)


def verify_token_ids(rows: Rows, files: dict[int, Path]) -> None:
    """Each reusable file's ``token_ids`` must be its row's ``input_ids`` (reads only that
    small tensor)."""
    import numpy as np
    from safetensors import safe_open

    for i in sorted(k for k in files if k < len(rows)):
        try:
            with safe_open(str(files[i]), framework="numpy") as fh:
                tok = fh.get_tensor("token_ids")
        except Exception:  # unreadable: it will be redone
            continue
        if not np.array_equal(tok, rows.input_ids([i])[0]):
            raise StageError(
                f"{files[i]}: token_ids differ from row {i} of {rows.path}: the files come from "
                f"other rows; remove them or set extract.on_mismatch=restart"
            )


def _manifest_count(out: Path) -> int:
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        return int(json.loads((out / MANIFEST).read_text())["samples"]["count"])
    return 0


def bytes_needed(rows: Rows, todo: Sequence[int], n_layers: int, hidden: int, dtype: str) -> int:
    per_token = n_layers * hidden * _ITEMSIZE[dtype] + 8
    return sum(rows.lengths[i] * per_token + 512 for i in todo)


def check_disk(out: Path, need: int) -> None:
    free = shutil.disk_usage(out).free
    if need > free:
        raise StageError(
            f"{out}: needs {need / 1e9:.2f} GB for the remaining hidden states, "
            f"{free / 1e9:.2f} GB free"
        )


def peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _cleanup_if_empty(ex: Extraction, wrote_manifest: bool) -> None:
    """After a failure before any file was written: leave nothing behind."""
    if existing_files(ex.out):
        return
    if wrote_manifest:
        (ex.out / MANIFEST).unlink(missing_ok=True)
    if ex.created_out:
        shutil.rmtree(ex.out, ignore_errors=True)


def extract_hf(cfg: Config, progress: bool = True) -> dict[str, Any]:
    """The ``hf`` backend: run the target's language model over the prepared rows and
    write their hidden states; resumable, split by rank. Returns the stage metrics."""
    import torch
    from tqdm import tqdm

    t_start = time.perf_counter()
    ex = begin(cfg, "hf")
    e = cfg.extract
    spec, rows, out = ex.spec, ex.rows, ex.out
    n_layers = len(spec.aux_layer_ids) + 1
    plan = plan_batches(rows.lengths, e.batch_tokens, e.plan_rows)
    mine = rank_batches(plan, e.rank, e.world_size)
    done = {
        i for i, p in ex.reusable.items()
        if i < len(rows) and file_matches(p, rows.lengths[i], n_layers, spec.hidden_size, e.dtype)
    }
    todo = [(j, b) for j, b in mine if not all(i in done for i in b)]
    rows_todo = [i for _, b in todo for i in b if i not in done]
    wrote_manifest = False
    timings = Timings()
    stats: dict[str, Any] = {"tokens_computed": 0, "padded_tokens": 0}
    try:
        check_disk(out, bytes_needed(rows, rows_todo, n_layers, spec.hidden_size, e.dtype))
        lm = None
        if todo:
            lm = load_language_model(
                spec, ex.model_dir, cfg.model.dtype, cfg.hardware.device, cfg.hardware.gpu_count
            )
        write_manifest(out, ex.key, rows, {"plan": {"batch_tokens": e.batch_tokens,
                                                    "plan_rows": e.plan_rows,
                                                    "batches": len(plan)}})
        wrote_manifest = True
        if lm is not None:
            _run_batches(lm, ex, cfg, todo, done, timings, stats, progress, tqdm, torch)
    except BaseException:
        _cleanup_if_empty(ex, wrote_manifest)
        raise
    wall = time.perf_counter() - t_start
    compute_wall = stats.get("loop_wall_s", 0.0)
    tokens = stats["tokens_computed"]
    metrics = {
        "backend": "hf",
        "hardware": cfg.hardware.name,
        "target": spec.name,
        "aux_layer_ids": list(spec.aux_layer_ids),
        "dtype": e.dtype,
        "rank": e.rank,
        "world_size": e.world_size,
        "samples": len(rows),
        "tokens": rows.tokens,
        "samples_written": timings.files_written,
        "samples_reused": sum(1 for _, b in mine for i in b if i in done),
        "tokens_computed": tokens,
        "batches_total": len(plan),
        "batches_rank": len(mine),
        "batches_computed": len(todo),
        "batches_skipped": len(mine) - len(todo),
        "padding_efficiency": tokens / stats["padded_tokens"] if stats["padded_tokens"] else 1.0,
        "tokens_per_s": tokens / compute_wall if compute_wall > 0 else 0.0,
        "wall_s": wall,
        "compute_wall_s": compute_wall,
        "forward_s": timings.forward_s,
        "capture_s": timings.capture_s,
        "serialize_s": timings.serialize_s,
        "fsync_s": timings.fsync_s,
        "queue_wait_s": timings.queue_wait_s,
        "bytes_written": timings.bytes_written,
        "bytes_per_token": timings.bytes_written / tokens if tokens else 0.0,
        "peak_rss_bytes": peak_rss_bytes(),
        "threads": torch.get_num_threads(),
    }
    if torch.cuda.is_available():
        metrics["peak_gpu_memory_bytes"] = int(torch.cuda.max_memory_allocated())
    return metrics


def _run_batches(
    lm: LanguageModel, ex: Extraction, cfg: Config, todo: list[tuple[int, list[int]]],
    done: set[int], timings: Timings, stats: dict[str, Any], progress: bool, tqdm: Any, torch: Any,
) -> None:
    e = cfg.extract
    out_dtype = getattr(torch, e.dtype)
    pad_id = _pad_id(lm.model)
    capture = Capture(lm, ex.spec.aux_layer_ids)
    writer = BatchWriter(ex.out, e.writer_queue, e.fsync, timings, e.fail_after)
    total = sum(ex.rows.lengths[i] for _, b in todo for i in b)
    bar = tqdm(total=total, unit="tok", unit_scale=True, desc=f"extract hf rank {e.rank}",
               disable=not progress, mininterval=1.0)
    t0 = time.perf_counter()
    ok = False
    try:
        with torch.inference_mode():
            for n_batch, (_j, batch) in enumerate(todo):
                seqs = ex.rows.input_ids(batch)
                tf = time.perf_counter()
                last, _ = forward_batch(lm, seqs, pad_id)
                if lm.device.type == "cuda":
                    torch.cuda.synchronize()
                tc = time.perf_counter()
                hs = capture.take()
                if n_batch == 0:
                    _check_capture(lm, hs, last)
                hs = hs.to(out_dtype).cpu()
                items = []
                for b, row in enumerate(batch):
                    if row in done:
                        continue
                    n = len(seqs[b])
                    items.append((row, torch.from_numpy(seqs[b]), hs[b, :n]))
                td = time.perf_counter()
                timings.forward_s += tc - tf
                timings.capture_s += td - tc
                real = sum(len(s) for s in seqs)
                stats["tokens_computed"] += real
                stats["padded_tokens"] += len(seqs) * max(len(s) for s in seqs)
                writer.put(items)
                bar.update(real)
        writer.close()
        ok = True
    finally:
        if not ok:
            writer.abort()
        capture.remove()
        bar.close()
        stats["loop_wall_s"] = time.perf_counter() - t0


def _check_capture(lm: LanguageModel, hs: Any, last: Any) -> None:
    """The captured final state must be what the final norm received: norm(captured) ==
    the decoder's output. Catches a hook on the wrong module before any file is written."""
    import torch

    normed = lm.norm(hs[:, :, -1].to(last.dtype))
    if not torch.allclose(normed.float(), last.float(), rtol=1e-3, atol=1e-3):
        raise StageError("the captured final hidden state does not reproduce the final norm's output")


def _pad_id(model: Any) -> int:
    pad = getattr(model.config, "pad_token_id", None)
    if isinstance(pad, int) and pad >= 0:
        return pad
    return 0

