"""The train stage's inputs, checked before any training starts: the local target
directory, the prepared rows and the hidden states extracted from them.

Hidden states of another target, revision or layer set would train a draft that vLLM then
loads without complaint and that proposes garbage, so they are refused here with the file
and the key that differ.
"""

from __future__ import annotations

from pathlib import Path

from eagle3_pipeline.core.errors import ConfigError, rebuild_hint
from eagle3_pipeline.core.safetensors import read_header
from eagle3_pipeline.extract.record import ExtractManifest
from eagle3_pipeline.targets.adapter import TargetSpec
from eagle3_pipeline.train.errors import TrainingError


def target_model_dir(spec: TargetSpec) -> Path:
    """The local target directory (embeddings, lm_head, final norm are read from it)."""
    if not spec.path:
        raise TrainingError(
            "target.json has no local path: training needs the target's "
            "embedding, lm_head and final-norm weights on this machine"
        )
    path = Path(spec.path)
    if not (path / "config.json").is_file():
        raise TrainingError(f"{path}: target directory has no config.json (target.json path)")
    return path


def count_rows(prepared: Path) -> int:
    """Rows of the prepared dataset, which must have speculators' columns."""
    from datasets import load_from_disk

    if not prepared.is_dir():
        raise TrainingError(f"{prepared}: prepared dataset not found (run the prepare stage)")
    try:
        ds = load_from_disk(str(prepared))
    except Exception as exc:  # datasets raises many kinds for a damaged directory
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise TrainingError(
            f"{prepared}: the prepared dataset is unreadable "
            f"({type(exc).__name__}: {first}); {rebuild_hint('prepare')}"
        ) from None
    for col in ("input_ids", "loss_mask", "seq_len"):
        if col not in ds.column_names:
            raise TrainingError(f"{prepared}: column {col!r} missing (have {ds.column_names})")
    return len(ds)


def _check_manifest(path: Path, manifest: ExtractManifest, spec: TargetSpec) -> None:
    """The extract stage's manifest names the layers and the target it read."""
    layers = manifest.layers.aux_layer_ids
    if layers != list(spec.aux_layer_ids):
        raise TrainingError(
            f"{path}: hidden states of layers {layers}, but target.json's aux layer "
            f"ids are {spec.aux_layer_ids}: rerun the extract stage"
        )
    recorded = manifest.target
    mine = {
        "name": spec.name,
        "hub_id": spec.hub_id,
        "revision": spec.revision,
        "num_layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "vocab_size": spec.vocab_size,
    }
    for key, value in mine.items():
        theirs = getattr(recorded, key)
        if theirs != value:
            raise TrainingError(
                f"{path}: hidden states from target {key}={theirs!r}, "
                f"but target.json has {key}={value!r}: rerun the extract stage"
            )


def _check_files(hs_dir: Path, spec: TargetSpec, n_rows: int) -> None:
    """One whole file per prepared row, each ``[seq, n_aux + 1, hidden]``: every header is
    read (no tensor data), so a truncated or foreign file is named here, before the first
    step, not in a loader traceback mid-epoch."""
    missing = [i for i in range(n_rows) if not (hs_dir / f"hs_{i}.safetensors").is_file()]
    if missing:
        raise TrainingError(
            f"{hs_dir}: no hidden states for {len(missing)} of {n_rows} prepared rows "
            f"(first: hs_{missing[0]}.safetensors); {rebuild_hint('extract')}"
        )
    want = [len(spec.aux_layer_ids) + 1, spec.hidden_size]
    for i in range(n_rows):
        path = hs_dir / f"hs_{i}.safetensors"
        try:
            info = read_header(path).get("hidden_states")
        except ConfigError as exc:
            raise TrainingError(f"{exc}; {rebuild_hint('extract')}") from None
        shape = list(info.shape) if info is not None else None
        if not shape or len(shape) != 3 or shape[1:] != want:
            raise TrainingError(
                f"{path}: hidden_states shape {shape}, expected [seq, {want[0]}, {want[1]}] "
                f"({len(spec.aux_layer_ids)} aux layers + final state, hidden "
                f"{spec.hidden_size}); {rebuild_hint('extract')}"
            )


def check_hidden_states(hs_dir: Path, spec: TargetSpec, n_rows: int) -> ExtractManifest:
    """Refuse hidden states made from another target, revision or layer set; return the
    manifest.

    Reads ``manifest.json`` (written by the extract stage) and the header of the first
    file: the layer ids must be target.json's aux ids, the target's name / hub id /
    revision / sizes must be target.json's, and the tensors must be
    ``[seq, n_aux + 1, hidden]`` with the target's hidden size.
    """
    manifest_path = hs_dir / "manifest.json"
    manifest = ExtractManifest.read(manifest_path)
    _check_manifest(manifest_path, manifest, spec)
    if manifest.is_online:  # no files: a server makes them during training
        count = manifest.samples.count
        if count != n_rows:
            raise TrainingError(
                f"{manifest_path}: recorded for {count} rows, the prepared "
                f"dataset has {n_rows}: rerun the extract stage"
            )
    else:
        _check_files(hs_dir, spec, n_rows)
    return manifest
