"""Tripwires for the speculators internals that ``eagle3_pipeline.compat.speculators`` relies on.

Each assertion names one internal of speculators 0.9; when an upgrade moves it, this file
fails with that name instead of the pipeline misbehaving quietly (a flex-attention model
on CPU, a reload that reaches for the hub, training-only tensors in a published draft).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path
from typing import Any

import pytest
import torch

HUB_ID = "example-org/not-on-this-machine"


def test_speculators_internals_used_by_compat() -> None:
    from importlib.metadata import version

    from speculators.config import VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    assert version("speculators").startswith("0.9."), (
        f"speculators {version('speculators')}: compat.py was written against 0.9; "
        "re-check every workaround in it"
    )
    # load_draft redirects this field; from_pretrained reads the verifier through it.
    assert "name_or_path" in VerifierConfig.model_fields
    src = inspect.getsource(Eagle3DraftModel.from_pretrained)
    assert "speculators_config.verifier.name_or_path" in src, (
        "Eagle3DraftModel.from_pretrained no longer reads verifier.name_or_path"
    )
    # load_draft sets the attention implementation because __init__ overrides None.
    init_src = inspect.getsource(Eagle3DraftModel.__init__)
    assert "_attn_implementation is None" in init_src and "simple_flex_attention" in init_src
    # The validator's rules assume these defaults and save-time exclusions.
    fields = Eagle3SpeculatorConfig.model_fields
    for name in (
        "transformer_layer_config",
        "eagle_aux_hidden_state_layer_ids",
        "draft_vocab_size",
        "norm_before_residual",
        "speculators_config",
    ):
        assert name in fields, f"Eagle3SpeculatorConfig lost field {name}"
    assert fields["norm_before_residual"].default is False, (
        "speculators' norm_before_residual default changed: revisit checkpoint.py's rule"
    )
    assert {"verifier_lm_head.weight", "verifier_norm.weight"} <= set(
        Eagle3DraftModel._keys_to_ignore_on_save
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, torch.Tensor]]:
    """A tiny Llama target and a draft saved with a hub id that cannot be resolved here."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("compat")
    shape: dict[str, Any] = dict(
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    target = root / "target"
    LlamaForCausalLM(
        LlamaConfig(num_hidden_layers=4, tie_word_embeddings=False, **shape)
    ).save_pretrained(target)
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=LlamaConfig(num_hidden_layers=1, **shape),
        draft_vocab_size=128,
        norm_before_residual=True,
        eagle_aux_hidden_state_layer_ids=[1, 2, 3],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=2)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=str(target), architectures=["LlamaForCausalLM"]),
        ),
    )
    model = Eagle3DraftModel(config)
    assert model._attn_impl == "simple_flex_attention", "speculators' silent default moved"
    model.load_verifier_weights()
    model.config.speculators_config.verifier.name_or_path = HUB_ID
    draft = root / "draft"
    model.save_pretrained(draft)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return draft, target, state


@pytest.mark.integration
def test_load_draft_offline_with_a_hub_id(
    saved: tuple[Path, Path, dict[str, torch.Tensor]],
) -> None:
    from eagle3_pipeline.compat.speculators import load_draft

    draft, target, state = saved
    published = json.loads((draft / "config.json").read_text())
    assert published["speculators_config"]["verifier"]["name_or_path"] == HUB_ID

    model = load_draft(draft, target)
    assert model._attn_impl == "sdpa"
    assert model.config.transformer_layer_config._attn_implementation == "sdpa"
    assert not model.training
    # the published id is back, so a re-save never leaks the local target path
    assert model.config.speculators_config.verifier.name_or_path == HUB_ID
    assert model.config.eagle_aux_hidden_state_layer_ids == [1, 2, 3]
    loaded = model.state_dict()
    for name in ("fc.weight", "layers.0.self_attn.q_proj.weight", "lm_head.weight", "norm.weight"):
        assert torch.equal(loaded[name], state[name]), name
    # verifier weights (not saved) were read from the local target directory
    assert torch.isfinite(loaded["verifier_lm_head.weight"]).all()
    assert torch.equal(loaded["verifier_lm_head.weight"], state["verifier_lm_head.weight"])


@pytest.mark.integration
def test_load_draft_needs_a_local_target(
    saved: tuple[Path, Path, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    from eagle3_pipeline.compat.speculators import load_draft

    draft, _, _ = saved
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_draft(draft, tmp_path)


# --------------------------------------------------------------------------- train stage


def test_internals_used_by_the_strict_dataset_and_the_cpu_trainer() -> None:
    """Tripwires for compat.strict_hidden_states_dataset and compat.speculators_trainer."""
    from hs_connectors import FileTransfer
    from speculators.train import trainer as trainer_mod
    from speculators.train.data import ArrowDataset
    from speculators.train.recovery import SampleUnavailable

    params = inspect.signature(ArrowDataset.__init__).parameters
    for name in (
        "datapath",
        "transfer",
        "on_missing",
        "train_ratio",
        "split",
        "hidden_states_dtype",
    ):
        assert name in params, f"ArrowDataset.__init__ lost parameter {name}"
    assert params["on_missing"].default == "generate", "on_missing default changed"
    assert hasattr(ArrowDataset, "_map_to_file_idx")
    raw = inspect.getsource(ArrowDataset._get_raw_data)
    assert "SampleUnavailable(" in raw and "torch.equal" in raw, (
        "ArrowDataset no longer reports token mismatches as SampleUnavailable"
    )
    # compat recognises it with isinstance and names its reason in the error it raises
    assert "reason" in {f.name for f in dataclasses.fields(SampleUnavailable)}
    assert "hidden_states_path" in inspect.getsource(FileTransfer.__init__)
    # the CPU patches: device from get_local_rank, synchronize in the step timer
    assert "self.model.to(self.local_rank)" in inspect.getsource(trainer_mod.Trainer.setup_model)
    assert "get_local_rank()" in inspect.getsource(trainer_mod.Trainer.__init__)
    assert "device_type" in inspect.getsource(trainer_mod.Trainer.train_epoch)
    timer_src = inspect.getsource(trainer_mod._StepTimer)
    assert "torch.accelerator.synchronize()" in timer_src
    for name in ("mark", "now"):
        assert hasattr(trainer_mod._StepTimer, name)
    # compat.stock_cli_main: the CLI builds its Trainer from the trainer module's names
    from speculators.train import cli as cli_mod
    from speculators.train.config import TrainConfig

    assert cli_mod.Trainer is trainer_mod.Trainer and callable(TrainConfig.resolve)
    assert inspect.signature(cli_mod.main).parameters.keys() == {"cfg"}


def test_strict_dataset_raises_where_speculators_returns_sample_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The promise of compat.strict_hidden_states_dataset: a row whose hidden-states file
    ArrowDataset rejects (it returns SampleUnavailable and only warns) is an error naming
    the row, its file and speculators' reason -- never a silently dropped sample."""
    from hs_connectors import FileTransfer
    from speculators.train.data import ArrowDataset
    from speculators.train.recovery import SampleUnavailable

    from eagle3_pipeline.compat.speculators import strict_hidden_states_dataset

    def fake_init(self: ArrowDataset, **kwargs: object) -> None:
        assert kwargs["on_missing"] == "raise"  # never "generate" (a server on localhost)
        self.transfer = kwargs["transfer"]  # type: ignore[assignment]

    reason = "Cached token ids do not match sample 5"
    monkeypatch.setattr(ArrowDataset, "__init__", fake_init)
    monkeypatch.setattr(ArrowDataset, "_map_to_file_idx", lambda self, index: index + 1)
    monkeypatch.setattr(
        ArrowDataset, "__getitem__", lambda self, index: SampleUnavailable(reason=reason)
    )
    ds = strict_hidden_states_dataset(tmp_path, tmp_path, "train", 0.8, 64, torch.float32)
    assert isinstance(ds.transfer, FileTransfer)
    with pytest.raises(
        ValueError,
        match=rf"hs_6\.safetensors: unusable for prepared row 6 "
        rf"\({reason}\)",
    ):
        ds[5]


@pytest.mark.integration
def test_stock_trainer_runs_a_step_on_cpu(saved) -> None:
    """speculators' Trainer, with compat's patches only, trains a draft on CPU."""
    import tempfile

    from speculators import SpeculatorModelConfig
    from speculators.losses import resolve_loss_config
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.trainer import TrainerConfig
    from torch.utils.data import DataLoader

    from eagle3_pipeline.compat.speculators import speculators_trainer

    draft_dir, target_dir, _ = saved

    config = SpeculatorModelConfig.from_pretrained(str(draft_dir))
    config.speculators_config.verifier.name_or_path = str(target_dir)
    config.transformer_layer_config._attn_implementation = "sdpa"
    model = Eagle3DraftModel.from_pretrained(str(draft_dir), config=config)
    h = model.hidden_size
    n_aux = len(model.config.eagle_aux_hidden_state_layer_ids)
    seq = 16
    batch = {
        "hidden_states": torch.randn(1, seq, n_aux * h),
        "input_ids": torch.randint(0, model.verifier_vocab_size, (1, seq)),
        "verifier_last_hidden_states": torch.randn(1, seq, h),
        "loss_mask": torch.ones(1, seq, dtype=torch.long),
        "position_ids": torch.arange(seq).unsqueeze(0),
        "document_ids": torch.zeros(1, seq, dtype=torch.long),
        "error_records": 0,
    }
    before = model.fc.weight.detach().clone()
    kwargs = {
        "ttt_steps": 2,
        "ttt_step_loss_decay": 1.0,
        "loss_config": resolve_loss_config("kl_div", "eager"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        tcfg = TrainerConfig(
            lr=1e-2,
            num_epochs=1,
            save_path=tmp,
            train_call_kwargs=kwargs,
            hidden_states_dtype=torch.float32,
            scheduler_type="none",
        )
        loader: DataLoader = DataLoader([batch], batch_size=None)  # type: ignore[arg-type]
        trainer = speculators_trainer(model, tcfg, loader, None, device="cpu")
        trainer.train_epoch(0)
    assert trainer.global_step == 1
    assert not torch.equal(before, model.fc.weight.detach())


@pytest.mark.integration  # a real HTTP server and speculators' client
def test_speculators_offline_client_sends_the_api_key(tmp_path: Path) -> None:
    """speculators' ``generate-offline-data`` hard-codes ``api_key="EMPTY"``; run through
    ``compat.offline_client`` it sends the per-run key from the environment instead. A real
    localhost server records the Authorization header of each client's first request."""
    import http.server
    import os
    import subprocess
    import sys
    import threading

    from datasets import Dataset

    from eagle3_pipeline.compat.offline_client import KEY_ENV, MODULE

    seen: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            body = b'{"object": "list", "data": []}'  # the client then stops: no model
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    data = tmp_path / "prepared"
    Dataset.from_dict({"input_ids": [[1, 2, 3]], "loss_mask": [[0, 1, 1]]}).save_to_disk(data)
    argv = [
        "generate-offline-data",
        "--endpoint",
        f"http://127.0.0.1:{httpd.server_port}/v1",
        "--preprocessed-data",
        str(data),
        "--output",
        str(tmp_path / "hs"),
    ]
    try:
        for key in ("run-key-123", None):
            env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
            if key:
                env[KEY_ENV] = key
            out = subprocess.run(
                [sys.executable, "-m", MODULE, *argv],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert out.returncode != 0 and "No models found" in out.stdout + out.stderr
    finally:
        httpd.shutdown()
    assert seen == ["Bearer run-key-123", "Bearer EMPTY"], seen


def test_speculators_builds_every_draft_layer_type_we_offer() -> None:
    """``draft.layers`` is the intersection of what speculators builds and vLLM serves:
    fails when speculators drops a type (or maps it to another config class). The MLA
    layer is ours (draft/mla.py registers it; tests/draft/test_mla_draft.py)."""
    from speculators.train.cli import DRAFT_ARCH_CONFIGS

    from eagle3_pipeline.draft.layers import DRAFT_LAYERS, config_class

    for name, kind in DRAFT_LAYERS.items():
        if kind.mla:
            assert name not in DRAFT_ARCH_CONFIGS, "speculators builds MLA drafts now"
            continue
        assert name in DRAFT_ARCH_CONFIGS, f"speculators no longer builds {name} drafts"
        assert DRAFT_ARCH_CONFIGS[name] is config_class(kind), name


def test_the_fused_loss_kernels_share_their_autotune_configs_and_we_separate_them() -> None:
    """speculators 0.9's two fused-loss kernels hold one autotune config list, which torch
    2.11's dynamo refuses to reach twice (the H200 proof's train stage). When speculators
    stops sharing it this test fails: drop compat.speculators.separate_fused_loss_configs."""
    pytest.importorskip("triton")
    from speculators.losses import fused

    from eagle3_pipeline.compat.speculators import separate_fused_loss_configs

    forward, backward = fused.loss_forward_kernel, fused.loss_backward_kernel
    shared = backward.configs is forward.configs
    before = [(c.kwargs, c.num_warps) for c in forward.configs]
    assert shared, "speculators no longer shares the list: the workaround can go"
    assert separate_fused_loss_configs() is True
    assert backward.configs is not forward.configs
    assert not any(b is f for b, f in zip(backward.configs, forward.configs, strict=True))
    # the same candidates, in the same order: the autotuner chooses as before
    assert [(c.kwargs, c.num_warps) for c in backward.configs] == before
    assert [(c.kwargs, c.num_warps) for c in forward.configs] == before
    assert separate_fused_loss_configs() is False  # once is enough


def test_the_loss_names_the_schema_accepts_are_speculators_own() -> None:
    """``core.choices.LossName`` (checked at compose) is what ``resolve_loss_config``
    knows under both implementations; fails when speculators adds, drops or renames one."""
    from speculators.losses.utils import _LOSS_FN_MAPS

    from eagle3_pipeline.core.choices import LossName

    for impl, names in _LOSS_FN_MAPS.items():
        assert set(names) == {n.value for n in LossName}, impl


def test_dvc_internals_used_by_eagle3_remote() -> None:
    """What ``compat/dvc_remote.py`` reads of DVC; its behaviour (and the ``dvc push`` it
    works around) is exercised on real repositories in ``tests/tools/test_remote.py``."""
    from dvc.config import NoRemoteError, RemoteNotFoundError
    from dvc.data_cloud import DataCloud, Remote
    from dvc.exceptions import DvcException, NotDvcRepoError
    from dvc_data.hashfile.db import HashFileDB, get_index
    from dvc_data.hashfile.db.index import ObjectDBIndexBase
    from dvc_data.hashfile.hash_info import HashInfo
    from dvc_data.hashfile.tree import Tree

    assert issubclass(NoRemoteError, DvcException) and issubclass(RemoteNotFoundError, DvcException)
    assert issubclass(NotDvcRepoError, DvcException)
    assert {"name"} <= set(inspect.signature(DataCloud.get_remote).parameters)
    assert {"name", "command", "hash_name"} <= set(
        inspect.signature(DataCloud.get_remote_odb).parameters
    )
    assert {"objs", "remote"} <= set(inspect.signature(DataCloud.push).parameters)
    assert {"name", "path", "fs"} <= set(inspect.signature(Remote.__init__).parameters)
    assert {"oids", "jobs"} <= set(inspect.signature(HashFileDB.oids_exist).parameters)
    assert callable(HashFileDB.oid_to_path) and callable(HashFileDB.exists)
    assert callable(Tree.load) and callable(get_index)
    assert callable(ObjectDBIndexBase.clear) and callable(ObjectDBIndexBase.close)
    hi = HashInfo("md5", "0" * 32 + ".dir")
    assert hi.isdir and (hi.value or "").endswith(".dir")


# --------------------------------------------------------------------------- torch's Muon


def test_torch_muon_still_orthogonalises_in_bfloat16_on_a_cpu() -> None:
    """compat/torch_muon.py exists because torch's Newton-Schulz casts to bfloat16 (slow
    on CPUs without native bf16). This fails once torch stops doing so: drop the patch."""
    import torch
    import torch.optim._muon as muon

    fn = muon._zeropower_via_newtonschulz
    original = getattr(fn, "__wrapped__", fn)
    out = original(torch.randn(8, 16), (3.4445, -4.7750, 2.0315), 5, 1e-7)
    assert out.dtype == torch.bfloat16


def test_float32_newton_schulz_is_torchs_iteration_at_higher_precision() -> None:
    import torch
    import torch.optim._muon as muon

    from eagle3_pipeline.compat.torch_muon import (
        newton_schulz_float32,
        newton_schulz_on_cpu,
    )

    torch.manual_seed(0)
    fn = muon._zeropower_via_newtonschulz
    original = getattr(fn, "__wrapped__", fn)
    coeffs = (3.4445, -4.7750, 2.0315)
    for shape in ((32, 96), (96, 32)):  # wide and tall (transposed inside)
        g = torch.randn(*shape)
        ours = newton_schulz_float32(g, coeffs, 5, 1e-7)
        ref = original(g, coeffs, 5, 1e-7).float()
        assert ours.dtype == torch.float32 and ours.shape == g.shape
        assert torch.allclose(ours, ref, atol=0.05), (ours - ref).abs().max()
    # patched: torch's Muon step on CPU parameters goes through the float32 iteration
    assert newton_schulz_on_cpu("float32") and newton_schulz_on_cpu("float32")  # idempotent
    p_ours = torch.nn.Parameter(torch.randn(32, 96))
    p_ref = torch.nn.Parameter(p_ours.detach().clone())
    grad = torch.randn(32, 96)
    for p in (p_ours, p_ref):
        p.grad = grad.clone()
    torch.optim.Muon([p_ours], lr=0.01).step()
    muon._zeropower_via_newtonschulz = original
    try:
        torch.optim.Muon([p_ref], lr=0.01).step()
    finally:
        newton_schulz_on_cpu("float32")
    assert not torch.equal(p_ours, p_ref)  # the precision differs ...
    assert torch.allclose(p_ours, p_ref, atol=1e-3)  # ... the update does not


def test_a_bf16_run_orthogonalises_with_torchs_own_iteration_on_a_cpu() -> None:
    """A run training in bf16 (a CPU with native bf16) keeps torch's bfloat16 iteration,
    the fast one there; switching back to float32 restores the float32 one."""
    import torch
    import torch.optim._muon as muon

    from eagle3_pipeline.compat.torch_muon import newton_schulz_on_cpu

    torch.manual_seed(1)
    g = torch.randn(32, 96)
    coeffs = (3.4445, -4.7750, 2.0315)
    try:
        assert newton_schulz_on_cpu("bfloat16")
        fn = muon._zeropower_via_newtonschulz
        original = fn.__wrapped__  # type: ignore[attr-defined]  # functools.wraps in compat.torch_muon
        assert fn(g, coeffs, 5, 1e-7).dtype == torch.bfloat16
        assert torch.equal(fn(g, coeffs, 5, 1e-7), original(g, coeffs, 5, 1e-7))
        assert newton_schulz_on_cpu("float32")
        assert muon._zeropower_via_newtonschulz(g, coeffs, 5, 1e-7).dtype == torch.float32
    finally:
        newton_schulz_on_cpu("float32")
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        newton_schulz_on_cpu("float16")


def test_the_train_stage_orthogonalises_in_its_own_precision() -> None:
    """build_optimizer sets the CPU iteration from the run's dtype (train/optim.py)."""
    import torch
    import torch.optim._muon as muon

    from eagle3_pipeline.core.choices import OptimizerName
    from eagle3_pipeline.core.config import TrainConfig
    from eagle3_pipeline.train.optim import build_optimizer

    model = torch.nn.Linear(16, 8)
    g = torch.randn(8, 16)
    coeffs = (3.4445, -4.7750, 2.0315)
    try:
        build_optimizer(model, TrainConfig(optimizer=OptimizerName.muon), 4, "bfloat16")
        assert muon._zeropower_via_newtonschulz(g, coeffs, 5, 1e-7).dtype == torch.bfloat16
        build_optimizer(model, TrainConfig(optimizer=OptimizerName.muon), 4, "float32")
        assert muon._zeropower_via_newtonschulz(g, coeffs, 5, 1e-7).dtype == torch.float32
    finally:
        from eagle3_pipeline.compat.torch_muon import newton_schulz_on_cpu

        newton_schulz_on_cpu("float32")


def test_speculators_eagle3_forward_still_takes_torch_argmax() -> None:
    """compat/speculators_argmax.py swaps the ``torch`` these modules see; it pays only
    while they call ``torch.argmax`` over the vocabulary (speculators 0.9 does, 3 times a
    TTT step)."""
    import importlib
    import inspect

    from eagle3_pipeline.compat.speculators_argmax import MODULES

    calls = 0
    for name in MODULES:
        module = importlib.import_module(name)
        assert module.torch is torch
        calls += inspect.getsource(module).count("torch.argmax(")
    assert calls >= 3


def test_argmax_by_max_gives_torchs_indices_inside_and_restores_torch() -> None:
    import importlib

    from eagle3_pipeline.compat.speculators_argmax import MODULES, argmax_by_max

    core = importlib.import_module(MODULES[0])
    x = torch.randn(2, 50, 300).bfloat16()
    x[0, :, 7] = x[0, :, 9] = 100.0  # ties: both give the first maximal index
    with argmax_by_max():
        assert core.torch is not torch
        assert core.torch.nn is torch.nn  # everything else is torch itself
        for dim in (-1, 1):
            assert torch.equal(core.torch.argmax(x, dim=dim), torch.argmax(x, dim=dim))
        assert torch.equal(core.torch.argmax(x), torch.argmax(x))
    assert core.torch is torch


def test_torchs_cpu_flash_kernels_take_the_arguments_we_pass() -> None:
    """compat/torch_flash.py calls two private aten ops; their schemas as it expects."""
    from eagle3_pipeline.compat import torch_flash

    assert torch_flash.available()
    fwd = str(getattr(torch.ops.aten, torch_flash.FORWARD).default._schema)
    bwd = str(getattr(torch.ops.aten, torch_flash.BACKWARD).default._schema)
    assert "float dropout_p=0., bool is_causal=False, *, Tensor? attn_mask=None" in fwd
    assert "-> (Tensor output, Tensor logsumexp)" in fwd
    assert "Tensor out, Tensor logsumexp, float dropout_p, bool is_causal" in bwd
    q, k, v = (torch.randn(1, 2, 40, 8) for _ in range(3))
    out, lse = torch_flash.causal_forward(q, k, v, 0.5)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
    torch.testing.assert_close(out, ref)
    scores = (q @ k.transpose(-1, -2) * 0.5).masked_fill(
        ~torch.ones(40, 40, dtype=torch.bool).tril(), float("-inf")
    )
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1))
