"""Every workaround of speculators (0.9) internals lives in this module, and only here.

Why one module: speculators is young and its internals move between releases. Code
elsewhere in the pipeline calls the functions below instead of reaching into
speculators' private attributes, so when speculators changes there is exactly one place
to fix, and ``tests/compat/test_compat.py`` fails loudly, naming the internal that moved.

Nothing here is imported at module import time from speculators: ``import speculators``
costs about 7 s, and stages that never touch a draft model must not pay for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_draft(
    draft_dir: str | Path,
    verifier_dir: str | Path,
    attn_implementation: str = "sdpa",
    device: str = "cpu",
    config: Any = None,
) -> Any:
    """Reload a saved EAGLE-3 draft with speculators' own code: the project's ONE reload path.

    ``config``: an ``Eagle3SpeculatorConfig`` built by the caller (a draft saved in another
    format than speculators', e.g. the MLA draft's plain config: ``draft/checkpoint.py``);
    None reads speculators' config.json.

    Two speculators internals make a plain ``Eagle3DraftModel.from_pretrained(draft_dir)``
    unusable here:

    - It resolves the verifier through ``speculators_config.verifier.name_or_path`` (the aux
      layer ids against the verifier's config, and the verifier's embeddings / lm_head /
      final norm from its weights). A published draft carries the target's hub id there,
      which cannot be resolved offline; so the config is loaded first and that field is
      pointed at the local target directory for the reload only. The returned model's
      config carries the published id again, so saving it never leaks a local path.
    - ``Eagle3DraftModel.__init__`` silently picks ``simple_flex_attention`` when
      ``transformer_layer_config._attn_implementation`` is unset (it is not saved), and
      flex attention has no CPU backward. So the implementation is set on the config
      before the model is constructed.

    Returns the model in eval mode on ``device``, in the dtype it was saved in.
    """
    from speculators import SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    draft_dir = Path(draft_dir)
    verifier_dir = Path(verifier_dir)
    if not (verifier_dir / "config.json").is_file():
        raise FileNotFoundError(f"{verifier_dir}: no config.json (need the local target directory)")
    if config is None:
        config = SpeculatorModelConfig.from_pretrained(str(draft_dir))
    if not isinstance(config, Eagle3SpeculatorConfig):
        raise TypeError(
            f"{draft_dir}/config.json: speculators reads it as {type(config).__name__}, "
            "not an EAGLE-3 config"
        )
    verifier = config.speculators_config.verifier
    published_id = verifier.name_or_path
    verifier.name_or_path = str(verifier_dir)
    config.transformer_layer_config._attn_implementation = attn_implementation
    model = Eagle3DraftModel.from_pretrained(str(draft_dir), config=config)
    model.config.speculators_config.verifier.name_or_path = published_id
    return model.to(device).eval()


def register_draft_layer(model_type: str, components: Any) -> None:
    """Add a decoder-layer type to the ones ``Eagle3DraftModel`` builds.

    speculators 0.9 picks an EAGLE-3 draft's layer classes from the dict
    ``speculators.models.eagle3.model_definitions.model_classes`` by the layer config's
    ``model_type`` (llama and qwen3 only), and ``Eagle3DraftModel.__init__`` reads that same
    dict object. ``components`` is a ``speculators.models.base_components.ModelComponents``
    (first layer, later layers, norm, rotary). ``tests/compat/test_compat.py`` fails when the
    dict moves or the model stops reading it."""
    from speculators.models.eagle3 import core, model_definitions

    if core.model_classes is not model_definitions.model_classes:  # pragma: no cover
        raise RuntimeError(
            "speculators' Eagle3DraftModel no longer reads model_definitions.model_classes: "
            "update eagle3_pipeline.compat.speculators.register_draft_layer"
        )
    model_definitions.model_classes.setdefault(model_type, components)


# --------------------------------------------------------------------------- fused loss


def separate_fused_loss_configs() -> bool:
    """Give speculators' fused-loss backward kernel its own autotune config list.

    Why: speculators 0.9 decorates both Triton kernels of ``losses/fused.py`` with one
    ``triton.autotune(configs=_tile_configs(), ...)``, so both autotuners hold the same
    list object. Under ``torch.compile`` (speculators compiles ``compute_metrics``, which
    calls the fused loss) torch 2.11's dynamo reaches that list through both kernels and
    stops the first step with "ListVariable(length=21) is already tracked for mutation"
    (measured on an H200: the GPU proof's train stage failed on its first step, and passed
    with ``train.loss_implementation=eager``). A copy of the list and of each config gives
    dynamo two distinct objects; the autotuner's choices are unchanged. Returns whether it
    had to (False once speculators stops sharing the list: tests/compat/test_compat.py says
    so). Imports Triton: call it only where the fused loss is used."""
    import copy

    from speculators.losses import fused

    forward, backward = fused.loss_forward_kernel, fused.loss_backward_kernel
    if backward.configs is not forward.configs:
        return False
    backward.configs = [copy.copy(c) for c in forward.configs]
    return True


# --------------------------------------------------------------------------- training data


_STRICT_DATASET_CLASS: Any = None


def strict_hidden_states_dataset(
    prepared_dir: str | Path,
    hidden_states_dir: str | Path,
    split: str,
    train_ratio: float,
    max_len: int,
    hidden_states_dtype: Any,
) -> Any:
    """speculators' ``ArrowDataset`` over prepare's rows and extract's ``hs_{i}`` files, with
    its silent fallbacks turned into errors.

    Two loader traps: ``on_missing`` defaults to ``"generate"``
    (a vLLM server on localhost), so it is forced to ``"raise"``; and a file whose
    ``token_ids`` differ from the row comes back as ``SampleUnavailable`` with only a
    warning, and the collate function then drops it or trains on an empty placeholder.
    Here such a row raises ``ValueError`` naming the row and its file.
    """
    from hs_connectors import FileTransfer

    return _strict_class()(
        max_len=max_len,
        datapath=str(prepared_dir),
        transfer=FileTransfer(Path(hidden_states_dir)),
        on_missing="raise",
        train_ratio=train_ratio,
        split=split,  # type: ignore[arg-type]
        hidden_states_dtype=hidden_states_dtype,
    )


def _strict_class() -> type:
    global _STRICT_DATASET_CLASS
    from speculators.train.data import ArrowDataset
    from speculators.train.recovery import SampleUnavailable

    if _STRICT_DATASET_CLASS is None:

        class StrictArrowDataset(ArrowDataset):
            def __getitem__(self, index: int) -> Any:
                item = super().__getitem__(index)
                if isinstance(item, SampleUnavailable):
                    row = self._map_to_file_idx(index)
                    path = getattr(self, "source", None) or (
                        self.transfer.hidden_states_path  # type: ignore[attr-defined]
                        / f"hs_{row}.safetensors"
                    )
                    raise ValueError(
                        f"{path}: unusable for prepared row {row} "
                        f"({getattr(item, 'reason', None) or 'token ids differ from the row'})"
                    )
                return item

        _STRICT_DATASET_CLASS = StrictArrowDataset
    return _STRICT_DATASET_CLASS


def online_hidden_states_dataset(
    prepared_dir: str | Path,
    split: str,
    train_ratio: float,
    max_len: int,
    hidden_states_dtype: Any,
    *,
    endpoint: str,
    api_key: str,
    model: str,
    stored_dtype: Any,
    concurrency: int = 1,
    request_timeout_s: float = 600.0,
) -> Any:
    """speculators' ``ArrowDataset`` in its online mode (``on_missing="generate"``): every
    row's hidden states come from the vLLM server at ``endpoint`` and are deleted once read.

    Four changes, each to an internal of speculators 0.9: its client sends the API key
    ``"EMPTY"`` (our servers are private to the run, so ``_setup_client`` is replaced);
    nothing is read from a cache (``get_cached`` returns None: online stores nothing); the
    states are cast to ``stored_dtype``, as offline extraction stores them, so online and
    offline train on the same numbers; and ``__getitems__`` fetches a batch's rows with
    ``concurrency`` requests in flight (the DataLoader calls it for a whole batch), where
    speculators asks one row at a time. A failed row raises instead of being dropped."""
    from concurrent.futures import ThreadPoolExecutor

    import openai
    import torch
    from hs_connectors import FileTransfer

    class OnlineTransfer(FileTransfer):
        def get_cached(self, file_idx: int) -> Any:
            return None

        def get_generated(self, hs_transfer_params: dict[str, Any]) -> Any:
            data = super().get_generated(hs_transfer_params)
            if data is not None:
                data["hidden_states"] = data["hidden_states"].to(stored_dtype)
                data["token_ids"] = data["token_ids"].to(torch.int64)
            return data

    class OnlineArrowDataset(_strict_class()):  # type: ignore[misc]
        source = f"vLLM extraction server {endpoint}"

        def _setup_client(self) -> None:
            self.client = openai.OpenAI(base_url=self.vllm_endpoint, api_key=api_key, max_retries=0)

        def __getitem__(self, index: int) -> Any:
            from eagle3_pipeline.core.errors import StageError

            try:
                return super().__getitem__(index)
            except ValueError as exc:  # a row vLLM could not give: one line, not a trace
                raise StageError(f"{exc}; the extraction server's log says why") from None

        def __getitems__(self, indices: list[int]) -> list[Any]:
            if self.client is None:
                self._setup_client()
            if concurrency <= 1 or len(indices) <= 1:
                return [self[i] for i in indices]
            with ThreadPoolExecutor(min(concurrency, len(indices))) as pool:
                return list(pool.map(self.__getitem__, indices))

    return OnlineArrowDataset(
        max_len=max_len,
        datapath=str(prepared_dir),
        transfer=OnlineTransfer(Path()),  # the connector's paths are absolute
        vllm_endpoint=endpoint,
        on_missing="generate",
        train_ratio=train_ratio,
        split=split,  # type: ignore[arg-type]
        hidden_states_dtype=hidden_states_dtype,
        model=model,
        request_timeout=request_timeout_s,
        max_retries=1,
        generation_validation_retries=1,
    )


# --------------------------------------------------------------------------- stock Trainer on CPU


def speculators_trainer(
    model: Any,
    trainer_config: Any,
    train_loader: Any,
    val_loader: Any = None,
    device: str = "cpu",
) -> Any:
    """speculators' own ``Trainer`` on ``device``, CPU included (used by bench/train.py).

    As shipped it assumes an accelerator: ``setup_model`` and every batch transfer use
    ``get_local_rank()`` (device 0, i.e. ``cuda:0``), the step timer calls
    ``torch.accelerator.synchronize()`` (raises without a driver) and autocast uses the
    accelerator's type. The patches: the local rank is replaced by ``device`` for
    construction and afterwards, autocast gets ``device``'s type, and the step timer
    skips the synchronize when no accelerator is available. The training step itself
    (forward, backward, clip, optimizer, scheduler) is speculators' code unchanged.
    """
    import torch
    from speculators.train import trainer as trainer_mod

    _patch_cpu_step_timer()
    original = trainer_mod.get_local_rank
    trainer_mod.get_local_rank = lambda: device  # type: ignore[assignment,return-value]
    try:
        trainer = trainer_mod.Trainer(model, trainer_config, train_loader, val_loader)
    finally:
        trainer_mod.get_local_rank = original
    trainer.local_rank = device  # type: ignore[assignment]  # an int rank upstream
    trainer.device_type = torch.device(device).type
    return trainer


def _patch_cpu_step_timer() -> None:
    """speculators' step timer calls ``torch.accelerator.synchronize()``, which raises
    without an accelerator: on such a host it is replaced by one that only reads the clock."""
    import torch
    from speculators.train import trainer as trainer_mod

    if torch.accelerator.is_available() or getattr(
        trainer_mod._StepTimer, "_eagle3_cpu_patch", False
    ):
        return

    class _CpuStepTimer(trainer_mod._StepTimer):
        _eagle3_cpu_patch = True

        def mark(self, name: str) -> None:
            if self.enabled:
                import time

                self._marks[name] = time.perf_counter()

        def now(self) -> float | None:
            import time

            return time.perf_counter() if self.enabled else None

    trainer_mod._StepTimer = _CpuStepTimer  # type: ignore[misc]


def stock_cli_main(argv: list[str]) -> None:
    """speculators' own training CLI (``python -m speculators.train ARGS``), unchanged but
    for what a host without an accelerator needs (bench/recipe.py runs the stock recipe
    through it): the trainer's local rank is ``"cpu"`` instead of device 0, and the step
    timer does not synchronize, and torch's Muon orthogonalises in float32 on a CPU without
    native bf16 (as our float32 runs do: ``compat/torch_muon.py``; bfloat16 took 55 s a step
    there), in its own bfloat16 on one with it (AMX, AVX512-BF16). Flags a CPU forces are the caller's (sdpa attention, the
    eager loss, few loader workers)."""
    import sys

    import torch
    from speculators.train import trainer as trainer_mod
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig

    if not torch.accelerator.is_available():
        from eagle3_pipeline.compat.torch_muon import newton_schulz_on_cpu
        from eagle3_pipeline.runtime.cpu import read_this_cpu

        _patch_cpu_step_timer()
        trainer_mod.get_local_rank = lambda: "cpu"  # type: ignore[assignment,return-value]
        # the stock Muon too: bf16 matmuls crawl on a CPU without native bf16
        newton_schulz_on_cpu("bfloat16" if read_this_cpu().native_bf16 else "float32")
    sys.argv = ["speculators.train", *argv]
    main(TrainConfig.resolve())
