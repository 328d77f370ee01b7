"""The train stage: a draft that learns, on either tiny target, resumable, refusing bad input.

Its inputs are made by the real prepare (recorded answers, no regeneration) and extract
(hf backend) stages from the session's tiny targets, so the train stage is tested on
exactly the files the graph hands it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from eagle3_pipeline.core.choices import Device, Parallel
from eagle3_pipeline.core.config import ConfigError, load_config, validate
from eagle3_pipeline.train.view import TrainInputs

# A reduced config: a few dozen rows, short sequences, small packs, a small draft vocab.
REDUCED = [
    "train.epochs=4",
    "train.tokens_per_step=512",
    "train.draft_vocab_size=512",
    "train.lr=3e-3",
    "train.val_fraction=0.2",
    "train.checkpoint_every_steps=1000",
]
# The prepare and extract settings of the inputs: recorded answers, rows of <= 160 tokens.
DATA = ["data.regenerate=false", "data.max_seq_len=160", "extract.fsync=false"]
FAULT_ENV = "EAGLE3_FAULT_TRAIN_FAIL_AFTER_STEPS"


# --------------------------------------------------------------------------- data helper


def make_training_data(workdir: Path, *overrides: str) -> None:
    """Run the prepare and extract stages in ``workdir`` (which holds conf/ and the
    target stage's data/target/)."""
    import eagle3_pipeline.stages.extract as extract
    import eagle3_pipeline.stages.prepare as prepare

    old = os.getcwd()
    os.chdir(workdir)
    try:
        cfg = load_config([*DATA, *overrides])
        prepare.run(prepare.INPUTS.from_config(cfg), progress=False)
        extract.run(extract.INPUTS.from_config(cfg))
    finally:
        os.chdir(old)


def _workdir(src: Path, dst: Path) -> Path:
    """A copy of a prepared working directory (target + data), so tests do not interfere."""
    shutil.copytree(src, dst, symlinks=True)
    return dst


@pytest.fixture(scope="session")
def kimi_data(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("train_kimi")
    shutil.copytree(tiny_target, root, dirs_exist_ok=True)
    make_training_data(root, "train.samples=40")
    return root


@pytest.fixture
def run_in(tmp_path: Path):
    """chdir into a copy of a prepared working directory for the duration of a test."""
    old = os.getcwd()

    def enter(src: Path) -> Path:
        work = _workdir(src, tmp_path / "work")
        os.chdir(work)
        return work

    yield enter
    os.chdir(old)


# --------------------------------------------------------------------------- tests


def _spec(**kw: Any) -> Any:
    """Kimi-K2.5 at its real size (the draft's shape is resolved from it)."""
    from target_samples import KIMI_FULL_SIZE, target_spec

    return target_spec(**{**KIMI_FULL_SIZE, **kw})


def test_draft_shape_is_not_inherited_from_an_mla_moe_target() -> None:
    from eagle3_pipeline.core.config import DraftShapeConfig
    from eagle3_pipeline.draft.shape import resolve_draft_shape

    kimi = resolve_draft_shape(DraftShapeConfig(), _spec())
    assert kimi.hidden_size == 7168 and kimi.layer_type == "llama"
    assert kimi.head_dim == 7168 // 64 != 192  # not qk_nope + qk_rope, not qk_rope
    assert kimi.intermediate_size != 18432 and kimi.num_key_value_heads == 64
    dense = resolve_draft_shape(
        DraftShapeConfig(),
        _spec(
            hidden_size=4096,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=12288,
            attention="standard",
            moe=False,
        ),
    )
    assert (dense.head_dim, dense.num_key_value_heads, dense.intermediate_size) == (128, 8, 12288)
    with pytest.raises(ConfigError, match="hidden_size=1024 differs"):
        resolve_draft_shape(DraftShapeConfig(hidden_size=1024), _spec())


def test_vocab_always_holds_end_of_turn_and_reasoning_markers(tiny_target: Path) -> None:
    from eagle3_pipeline.draft.shape import build_vocab_mapping, special_token_ids
    from eagle3_pipeline.targets import tiny

    found = special_token_ids(tiny_target / "data" / "target" / "model")
    assert {tiny.END_OF_TURN, *tiny.REASONING_MARKERS} <= set(found)
    freq = {i: 1000 - i for i in range(100, 400)}  # the specials never occur here
    d2t, t2d = build_vocab_mapping(freq, 16, 2048, list(found.values()))
    selected = {i + int(d2t[i]) for i in range(16)}
    assert set(found.values()) <= selected and int(t2d.sum()) == 16
    with pytest.raises(ConfigError, match="larger than the target vocabulary"):
        build_vocab_mapping(freq, 4096, 2048, list(found.values()))


def test_killed_run_resumes_and_the_draft_learns(kimi_data: Path, run_in, monkeypatch) -> None:
    import psutil

    from eagle3_pipeline.compat.speculators import load_draft
    from eagle3_pipeline.stages.train import main

    work = run_in(kimi_data)
    args = [*REDUCED, "train.epochs=2", "train.checkpoint_every_steps=3"]
    monkeypatch.setenv(FAULT_ENV, "4")
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 1
    monkeypatch.delenv(FAULT_ENV)
    state = json.loads((work / "data/train_state/state.json").read_text())
    assert state["global_step"] == 3 and not state["finished"]
    assert not (work / "data/draft").exists() and not (work / "metrics/details/train.json").exists()

    main(args)  # the rerun resumes from step 3
    m = json.loads((work / "metrics/details/train.json").read_text())
    assert m["resumed"] and m["steps"] == m["total_steps"] and m["steps_this_run"] == m["steps"] - 3
    assert m["val_loss"] <= 0.8 * m["val_loss_untrained"], m
    assert len(m["val_accuracy_per_position"]) == 3 and m["gpu"]["mode"] == "not applicable"
    assert psutil.Process().children(recursive=True) == []  # no worker survives

    cfg = json.loads((work / "data/draft/config.json").read_text())
    spec = json.loads((work / "data/target/target.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == spec["aux_layer_ids"]
    assert cfg["norm_before_residual"] is True
    assert cfg["transformer_layer_config"]["num_aux_hidden_states"] == 3
    assert cfg["transformer_layer_config"]["model_type"] == "llama"
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    # a local target is named relative to the draft: the bytes do not depend on the clone
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "../target/model"
    # dvclive: the resumed run's curves hold every step, the killed run's 3 included
    live = work / "dvclive/train"
    loss = (live / "plots/metrics/train/loss.tsv").read_text().splitlines()
    assert loss[0].split("\t") == ["step", "loss"]
    assert [int(r.split("\t")[0]) for r in loss[1:]] == list(range(1, m["steps"] + 1))
    # one val point per epoch; the written draft is the chosen epoch's (train.select)
    val = (live / "plots/metrics/val/loss.tsv").read_text().splitlines()[1:]
    chosen = m["checkpoint"]["chosen_epoch"]
    assert len(val) == 2 and float(val[chosen].split("\t")[1]) == m["val_loss"]
    assert (live / "plots/images/curves.png").read_bytes()[:4] == b"\x89PNG"
    # the summary DVC shows carries the stage's own figures, unchanged
    summary = json.loads((live / "metrics.json").read_text())
    assert summary == {
        "step": m["steps"],
        "val": {"loss": m["val_loss"]},
        "tokens_per_s": m["tokens_per_s"],
    }  # no per-step noise in the headline
    val_acc = (live / "plots/metrics/val/acc_2.tsv").read_text().splitlines()[1:]
    assert float(val_acc[chosen].split("\t")[1]) == m["val_accuracy_per_position"][2]
    draft = load_draft(work / "data/draft", work / "data/target/model")
    assert draft.d2t.shape[0] == 512


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def test_the_draft_written_is_the_epoch_the_measure_chose(kimi_data: Path, run_in) -> None:
    """train.select: every epoch is a candidate; the one written scores best on the
    held-out rows by the measure; its figures are the record's; each epoch's draft is
    kept when asked, and the written draft is byte for byte the chosen one's."""
    from eagle3_pipeline.compat.speculators import load_draft
    from eagle3_pipeline.stages.train import main

    work = run_in(kimi_data)
    main([*REDUCED, "train.epochs=3", "train.keep_epoch_drafts=true"])
    m = json.loads((work / "metrics/details/train.json").read_text())
    choice = m["checkpoint"]
    cands = choice["candidates"]
    assert choice["measure"] == "val_acceptance" and [c["epoch"] for c in cands] == [0, 1, 2]
    # the candidates' figures are the curves' val points, epoch by epoch
    live = work / "dvclive/train/plots/metrics/val"
    for name, key in (("acceptance", "val_acceptance"), ("loss", "val_loss")):
        rows = (live / f"{name}.tsv").read_text().splitlines()[1:]
        assert [float(r.split("\t")[1]) for r in rows] == [c[key] for c in cands]
        assert [int(r.split("\t")[0]) for r in rows] == [c["step"] for c in cands]
    best = max(range(3), key=lambda i: (cands[i]["val_acceptance"], -i))
    assert choice["chosen_epoch"] == best and not choice["stopped_early"]
    assert m["val_loss"] == cands[best]["val_loss"]
    assert m["val_accuracy_per_position"] == cands[best]["val_accuracy_per_position"]
    epochs = work / "data/train_state/epochs"
    assert sorted(p.name for p in epochs.iterdir()) == ["epoch_000", "epoch_001", "epoch_002"]
    written = _tensors(work / "data/draft")
    for e in range(3):
        kept = _tensors(epochs / f"epoch_{e:03d}")
        assert kept.keys() == written.keys()
        # every epoch moved the weights: only the chosen epoch's equal the written draft
        assert all(torch.equal(kept[n], written[n]) for n in kept) == (e == best), e
        load_draft(epochs / f"epoch_{e:03d}", work / "data/target/model")  # each one serves


def test_patience_ends_the_run_when_no_epoch_does_better(kimi_data: Path, run_in) -> None:
    """A learning rate too small to move any argmax gives every epoch the same held-out
    figures: no epoch beats the first, and train.patience=1 stops after the second."""
    from eagle3_pipeline.stages.train import main

    work = run_in(kimi_data)
    main([*REDUCED, "train.epochs=4", "train.lr=1e-12", "train.patience=1"])
    m = json.loads((work / "metrics/details/train.json").read_text())
    choice = m["checkpoint"]
    assert choice["stopped_early"] and choice["patience"] == 1
    assert [c["epoch"] for c in choice["candidates"]] == [0, 1] and choice["chosen_epoch"] == 0
    assert m["steps"] == choice["candidates"][1]["step"] < m["total_steps"]
    state = json.loads((work / "data/train_state/state.json").read_text())
    assert state["finished"]  # a rerun trains anew rather than resuming past the stop


def _expect_refusal(overrides: list[str], match: str) -> None:
    """The train stage's plan refuses a config that composed: a refusal when composing
    fails here, outside ``pytest.raises``, instead of being credited to the plan."""
    from eagle3_pipeline.train.errors import TrainingError
    from eagle3_pipeline.train.plan import plan_training

    cfg = load_config([*REDUCED, *overrides])
    with pytest.raises((ConfigError, TrainingError), match=match):
        plan_training(TrainInputs.from_config(cfg))


def test_refuses_bad_settings(kimi_data: Path, run_in) -> None:
    """What only the target rules out is refused by the plan, naming the target's figure
    (draft.shape.check_train_config); a bound of the schema is refused when composing."""
    work = run_in(kimi_data)
    spec = json.loads((work / "data/target/target.json").read_text())
    _expect_refusal(
        ["train.draft_vocab_size=4096"],
        rf"^train\.draft_vocab_size=4096 is larger than the target vocabulary "
        rf"\({spec['vocab_size']} tokens\)$",
    )
    _expect_refusal(
        ["train.draft.hidden_size=256"],
        rf"^train\.draft\.hidden_size=256 differs from the target's hidden size "
        rf"{spec['hidden_size']}:",
    )
    with pytest.raises(ConfigError, match=r"train\.speculative_tokens=0 must be >= 1"):
        load_config([*REDUCED, "train.speculative_tokens=0"])


@pytest.mark.parametrize(
    ("section", "key", "value", "match"),
    [
        ("layers", "aux_layer_ids", [0, 1, 2], "layers \\[0, 1, 2\\]"),
        ("target", "name", "tiny_llama", "target name='tiny_llama'"),
        ("target", "revision", "abc", "revision='abc'"),
        ("target", "hidden_size", 64, "hidden_size=64"),
    ],
)
def test_refuses_hidden_states_of_another_target(
    kimi_data: Path, run_in, section, key, value, match
) -> None:
    work = run_in(kimi_data)
    path = work / "data/hidden_states/manifest.json"
    manifest = json.loads(path.read_text())
    manifest[section][key] = value
    path.write_text(json.dumps(manifest))
    _expect_refusal([], match)


def test_refuses_a_file_whose_tokens_differ_from_its_row(kimi_data: Path, run_in) -> None:
    from safetensors.torch import load_file, save_file

    from eagle3_pipeline.compat.speculators import strict_hidden_states_dataset

    work = run_in(kimi_data)
    f = work / "data/hidden_states/hs_1.safetensors"
    t = load_file(str(f))
    t["token_ids"] = t["token_ids"].flip(0).contiguous()
    save_file(t, str(f))
    ds = strict_hidden_states_dataset(
        work / "data/prepared", f.parent, "train", 0.8, 512, torch.float32
    )
    assert ds[0]["input_ids"].numel() > 0
    with pytest.raises(ValueError, match="hs_1.safetensors: unusable for prepared row 1"):
        _ = ds[1]


def test_tiny_llama_trains_through_the_same_path(
    tiny_llama_target: Path, tmp_path: Path, run_in, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "llama_src"
    shutil.copytree(tiny_llama_target, src)
    make_training_data(src, "model=tiny_llama", "train.samples=12")
    work = run_in(src)
    import eagle3_pipeline.train.launch as launch
    import eagle3_pipeline.train.plan as plan
    from eagle3_pipeline.stages.train import main

    plans: list[Any] = []  # the stage plans once, and the run never goes back to its view

    def counted(*args: Any, **kwargs: Any) -> Any:
        plans.append(real(*args, **kwargs))
        return plans[-1]

    real = plan.plan_training
    monkeypatch.setattr(plan, "plan_training", counted)
    monkeypatch.setattr(launch, "plan_training", counted)
    main([*REDUCED, "model=tiny_llama", "train.epochs=1", "train.max_steps=2"])
    assert len(plans) == 1
    m = json.loads((work / "metrics/details/train.json").read_text())
    assert m["steps"] == 2 and m["draft_shape"]["head_dim"] == 32
    cfg = json.loads((work / "data/draft/config.json").read_text())
    assert (
        cfg["eagle_aux_hidden_state_layer_ids"]
        == json.loads((work / "data/target/target.json").read_text())["aux_layer_ids"]
    )


# --------------------------------------------------------------------------- several workers


def _planned_batches(work: Path, overrides: list[str], world: int) -> list[list[list[list[int]]]]:
    """``[epoch][rank] -> batches of row ids``, from speculators' sampler as the plan has it."""
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    from eagle3_pipeline.compat.speculators import strict_hidden_states_dataset

    cfg = load_config(overrides)
    t = cfg.train
    ds = strict_hidden_states_dataset(
        work / "data/prepared",
        work / "data/hidden_states",
        "train",
        1.0 - t.val_fraction,
        t.tokens_per_step,
        torch.float32,
    )
    plan = []
    for epoch in range(t.epochs):
        ranks = []
        for rank in range(world):
            s = MultipackDistributedBatchSamplerV2(
                batch_max_length=t.tokens_per_step,
                lengths=ds.approx_lengths,
                num_replicas=world,
                rank=rank,
                seed=cfg.seed,
            )
            s.set_epoch(epoch)
            ranks.append([[int(i) for i in b] for b in s])
        plan.append(ranks)
    return plan


def _process_group_alive(pgid: int) -> list[int]:
    import psutil

    alive = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return alive


def _check_multiprocess_run(work: Path, args: list[str], parallel: str) -> dict[str, Any]:
    """The stage's own torchrun launch with 2 gloo workers: sharded data, rank 0's outputs,
    a reloadable draft, no process left behind."""
    import psutil

    from eagle3_pipeline.compat.speculators import load_draft
    from eagle3_pipeline.train.plan import plan_training
    from eagle3_pipeline.train.runtime import choose_parallel

    m = json.loads((work / "metrics/details/train.json").read_text())
    assert m["world_size"] == 2 and m["parallel"] == parallel
    assert m["distributed_backend"] == "gloo" and m["device"] == "cpu"
    launcher = m["launcher"]
    assert launcher["nproc"] == 2 and launcher["survivors"] == 0
    if parallel == "fsdp":  # rank 0 holds about half of every parameter
        assert 0.4 < m["local_parameter_fraction"] < 0.6
    else:
        assert m["local_parameter_fraction"] == 1.0
    assert launcher["command"].startswith("torchrun --standalone --nproc_per_node=2")
    assert _process_group_alive(launcher["process_group"]) == []
    assert psutil.Process().children(recursive=True) == []

    plan = _planned_batches(work, args, 2)
    planned_steps = sum(min(len(r) for r in ranks) for ranks in plan)
    assert m["steps"] == m["total_steps"] == planned_steps
    single = sum(len(_planned_batches(work, args, 1)[e][0]) for e in range(len(plan)))
    assert planned_steps < single  # each rank takes about half the packs
    assert len(m["data_parallel"]) == len(plan)
    for rec, ranks in zip(m["data_parallel"], plan, strict=True):
        rows = [{i for b in r for i in b} for r in ranks]
        assert rows[0] and rows[1] and not rows[0] & rows[1]  # the plan shards the rows
        assert rec["rows_per_rank"] == [len(r) for r in rows]  # and each rank trained on them
        assert rec["rows_on_several_ranks"] == 0
        assert rec["rows_seen"] == len(rows[0] | rows[1]) <= rec["train_rows"]

    p = plan_training(TrainInputs.from_config(load_config(args)))
    from eagle3_pipeline.draft.shape import estimate_parameters

    assert (
        estimate_parameters(
            p.shape,
            len(p.spec.aux_layer_ids),
            512,
            p.spec.vocab_size,
            load_config(args).train.draft,
        )[0]
        == m["trainable_parameters"]
    )
    assert (
        choose_parallel(TrainInputs.from_config(load_config(args)), p.shape, p.spec, 2)[0]
        == parallel
    )
    assert (work / "dvclive/train/plots/images/curves.png").is_file()
    cfg = json.loads((work / "data/draft/config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == p.spec.aux_layer_ids
    draft = load_draft(work / "data/draft", work / "data/target/model")
    assert draft.d2t.shape[0] == 512
    assert all(
        torch.isfinite(t).all() for t in draft.state_dict().values() if t.is_floating_point()
    )
    return m


@pytest.mark.slow
def test_two_cpu_workers_run_the_torchrun_path(kimi_data: Path, run_in) -> None:
    """``train.nproc=2`` on CPU: the stage's own launcher starts ``torchrun
    --nproc_per_node 2`` (gloo), the same launch that runs one worker per GPU on CUDA."""
    from eagle3_pipeline.stages.train import main

    work = run_in(kimi_data)
    args = [*REDUCED, "train.epochs=2", "train.nproc=2", "train.parallel=auto"]
    main(args)
    m = _check_multiprocess_run(work, args, "ddp")
    assert m["parallel_reason"].startswith("auto: ")
    assert m["val_loss"] < m["val_loss_untrained"]


@pytest.mark.slow
def test_fsdp_on_two_cpu_workers_checkpoints_and_resumes(
    kimi_data: Path, run_in, monkeypatch
) -> None:
    """FSDP2 (``fully_shard``) with gloo: the resumable state and the draft are gathered on
    rank 0; a killed run resumes from the gathered state and ends at the planned step."""
    from eagle3_pipeline.stages.train import main

    work = run_in(kimi_data)
    args = [
        *REDUCED,
        "train.epochs=2",
        "train.nproc=2",
        "train.parallel=fsdp",
        "train.checkpoint_every_steps=2",
    ]
    monkeypatch.setenv(FAULT_ENV, "3")  # inherited by the torchrun workers
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 1
    monkeypatch.delenv(FAULT_ENV)
    state = json.loads((work / "data/train_state/state.json").read_text())
    assert state["global_step"] == 2 and not state["finished"]
    saved = torch.load(work / "data/train_state/state.pt", weights_only=False)
    assert saved["model"]["fc.weight"].dim() == 2  # full tensors, not shards
    assert saved["model"]["fc.weight"].shape[1] == 3 * saved["model"]["fc.weight"].shape[0]
    assert not (work / "data/draft").exists()

    main(args)
    m = _check_multiprocess_run(work, args, "fsdp")
    assert m["resumed"] and m["steps_this_run"] == m["steps"] - 2
    assert m["parallel_reason"] == "train.parallel=fsdp"


def test_parallel_mode_selection(tmp_path: Path) -> None:
    from eagle3_pipeline.core.config import Config, DraftShapeConfig
    from eagle3_pipeline.draft.shape import estimate_parameters, resolve_draft_shape
    from eagle3_pipeline.runtime.precision import Precision, write_precision
    from eagle3_pipeline.train.distributed import dist_backend
    from eagle3_pipeline.train.runtime import choose_parallel, resolve_runtime

    kimi, cfg = _spec(), Config()
    cfg.train.draft_vocab_size = 32000
    one = resolve_draft_shape(DraftShapeConfig(), kimi)  # H=7168: ~0.8e9 trainable
    assert 0.5e9 < estimate_parameters(one, 3, 32000, kimi.vocab_size, DraftShapeConfig())[0] < 1e9
    assert (
        choose_parallel(TrainInputs.from_config(cfg), one, kimi, 8)[0] == "ddp"
    )  # fits a GPU as a DDP replica
    shape = resolve_draft_shape(DraftShapeConfig(num_layers=3), kimi)
    trainable, frozen = estimate_parameters(
        shape, 3, 32000, kimi.vocab_size, DraftShapeConfig(num_layers=3)
    )
    assert trainable > 1e9 and frozen > 1e9
    mode, reason = choose_parallel(TrainInputs.from_config(cfg), shape, kimi, 8)
    assert mode == "fsdp" and "fsdp_min_params" in reason
    assert choose_parallel(TrainInputs.from_config(cfg), shape, kimi, 1) == ("none", "one process")
    cfg.train.parallel = Parallel.ddp
    assert choose_parallel(TrainInputs.from_config(cfg), shape, kimi, 8) == (
        "ddp",
        "train.parallel=ddp",
    )

    llama = _spec(
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        attention="standard",
        moe=False,
        vocab_size=128256,
    )
    small = resolve_draft_shape(DraftShapeConfig(), llama)
    cfg = Config()
    cfg.train.draft_vocab_size = 32000
    mode, reason = choose_parallel(TrainInputs.from_config(cfg), small, llama, 8)
    assert mode == "ddp" and "trainable parameters" in reason
    cfg.hardware.device, cfg.hardware.gpu_memory_mib = Device.cuda, 8192  # the replica won't fit
    mode, reason = choose_parallel(TrainInputs.from_config(cfg), small, llama, 8)
    assert mode == "fsdp" and "gpu_memory_mib=8192" in reason
    cfg.hardware.gpu_memory_mib = 141 * 1024
    assert choose_parallel(TrainInputs.from_config(cfg), small, llama, 8)[0] == "ddp"
    cfg.train.fsdp_min_params = 100_000_000
    assert choose_parallel(TrainInputs.from_config(cfg), small, llama, 8)[0] == "fsdp"

    assert dist_backend("cuda") == "nccl" and dist_backend("cpu") == "gloo"
    cfg = Config()
    cfg.paths.precision = str(tmp_path / "precision.json")  # preflight's choice, on CPU
    write_precision(cfg.paths.precision, Precision("bfloat16", "a CPU with native bf16"))
    cfg.train.nproc = 2
    rt = resolve_runtime(TrainInputs.from_config(cfg))
    assert rt.device == "cpu" and rt.world_size == 2 and rt.launched
    assert (rt.dtype, rt.dtype_why) == ("bfloat16", "a CPU with native bf16")
    cfg.train.nproc = None
    assert not resolve_runtime(TrainInputs.from_config(cfg)).launched
    cfg.hardware.device, cfg.hardware.gpu_count = Device.cuda, 1
    assert (
        resolve_runtime(TrainInputs.from_config(cfg)).launched
        and resolve_runtime(TrainInputs.from_config(cfg)).world_size == 1
    )
    cfg.train.nproc = 4  # refused when the config is composed (tests/core/test_config.py)
    with pytest.raises(ConfigError, match="exceeds hardware.gpu_count=1"):
        validate(cfg)


# --------------------------------------------------------------------------- signals


def _start_stage(work: Path, args: list[str]) -> Any:
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-m", "eagle3_pipeline.stages.train", *args],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def _wait_for_checkpoint(work: Path, proc: Any, step: int, timeout_s: float = 300.0) -> None:
    import time

    state = work / "data/train_state/state.json"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"the stage ended (rc {proc.returncode}) before the signal: "
                f"{proc.stderr.read()[-2000:]}"
            )
        if state.is_file() and json.loads(state.read_text())["global_step"] >= step:
            return
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint at step {step} within {timeout_s}s")


def _assert_one_line_interrupt(stderr: str, sig: str) -> None:
    assert "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: train: interrupted by {sig};"), last
    assert "rerun" in last


def test_ctrl_c_prints_one_line_and_the_rerun_resumes(kimi_data: Path, run_in) -> None:
    """SIGINT (Ctrl-C) mid-training: exit 130 with one line, no traceback; the rerun
    resumes from the last checkpoint like after ``kill -9``."""
    import signal

    from eagle3_pipeline.stages.train import main

    work = run_in(kimi_data)
    args = [*REDUCED, "train.epochs=6", "train.checkpoint_every_steps=2"]
    proc = _start_stage(work, args)
    _wait_for_checkpoint(work, proc, 2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-3000:]
    _assert_one_line_interrupt(stderr, "SIGINT")
    saved = json.loads((work / "data/train_state/state.json").read_text())["global_step"]
    assert saved >= 2 and not (work / "data/draft").exists()

    main(args)
    m = json.loads((work / "metrics/details/train.json").read_text())
    assert m["resumed"] and m["steps_this_run"] == m["steps"] - saved


@pytest.mark.slow
def test_sigterm_stops_the_torchrun_workers(kimi_data: Path, run_in) -> None:
    """SIGTERM to the stage (DVC, a scheduler, ``kill``) while torchrun runs two workers:
    one line, exit 143, and no process the stage started is left."""
    import signal
    import time

    import psutil

    work = run_in(kimi_data)
    args = [*REDUCED, "train.epochs=6", "train.checkpoint_every_steps=2", "train.nproc=2"]
    proc = _start_stage(work, args)
    _wait_for_checkpoint(work, proc, 2)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len(children) >= 3, children  # torchrun + two workers
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr[-3000:]
    _assert_one_line_interrupt(stderr, "SIGTERM")
    time.sleep(0.5)
    alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], alive


@pytest.mark.slow
def test_the_faster_step_leaves_the_loss_curve_unchanged(kimi_data: Path, tmp_path: Path) -> None:
    """Same seed, same rows: speculators' stock step (dense sdpa, figures read every step,
    no prefetch) and ours give the same per-step losses to float32 rounding; prefetching
    and the log window change nothing at all (same order, same numbers)."""
    from eagle3_pipeline.stages.train import main

    runs = {
        "stock": [
            "train.attn_implementation=sdpa",
            "train.log_every_steps=1",
            "train.prefetch_batches=0",
        ],
        "ours": [],  # sdpa_packed, a 10-step log window, no prefetch on CPU
        "prefetch": ["train.prefetch_batches=2", "train.log_every_steps=3"],
    }
    losses: dict[str, list[float]] = {}
    old = os.getcwd()
    try:
        for name, extra in runs.items():
            work = _workdir(kimi_data, tmp_path / name)
            os.chdir(work)
            # AdamW: the step is what differs; Muon's Newton-Schulz iterations amplify the
            # same float32 rounding to 1.01e-4 over these steps (measured), past the bound
            main([*REDUCED, "train.epochs=2", "train.optimizer=adamw", *extra])
            rows = (work / "dvclive/train/plots/metrics/train/loss.tsv").read_text()
            losses[name] = [float(r.split("\t")[1]) for r in rows.splitlines()[1:]]
    finally:
        os.chdir(old)
    assert losses["prefetch"] == losses["ours"]
    a, b = losses["stock"], losses["ours"]
    assert len(a) == len(b) > 8
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b, strict=True))
    assert worst < 1e-4, (worst, a, b)


def test_an_mla_draft_trains_and_a_warm_start_takes_its_weights_exactly(
    kimi_data: Path, run_in
) -> None:
    """train.draft.layer_type=mla through the train stage, saved as vLLM serves it; then
    train.init_from=that draft: the new run's model starts from its weights and its
    vocabulary mapping, exactly; a source that does not fit is refused in one line."""
    from eagle3_pipeline.draft.checkpoint import load_trained_draft
    from eagle3_pipeline.stages.train import main
    from eagle3_pipeline.train.distributed import init_distributed
    from eagle3_pipeline.train.loop import DraftTrainer
    from eagle3_pipeline.train.plan import plan_training

    work = run_in(kimi_data)
    mla = [*REDUCED, "train.epochs=1", "train.max_steps=2", "train.draft.layer_type=mla"]
    main(mla)
    cfg = json.loads((work / "data/draft/config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV2ForCausalLM"] and cfg["kv_lora_rank"] == 512
    shutil.move(work / "data/draft", work / "source")
    (work / "data/train_state").rename(work / "old_state")

    warm = [*mla, f"train.init_from={work / 'source'}"]
    config = load_config(warm)
    plan = plan_training(TrainInputs.from_config(config))
    assert plan.init is not None and plan.init.format == "mla"
    model = DraftTrainer(plan, init_distributed("cpu"), progress=False).model
    source = load_trained_draft(work / "source", work / "data/target/model")
    want = source.state_dict()
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, want[name], rtol=0, atol=0, msg=name)

    main(warm)  # trains on from there, and says so
    record = json.loads((work / "metrics/details/train.json").read_text())
    assert record["init_from"]["format"] == "mla"
    assert record["init_from"]["sha256"] == plan.init.sha256

    _expect_refusal(
        [f"train.init_from={work / 'source'}"],  # a llama run from an MLA draft
        r"train.init_from=.*source: its layer_type is \"mla\" \(.*source/config.json: model_type\), "
        r"this run's is \"llama\"",
    )
    _expect_refusal(
        [*mla, "train.draft_vocab_size=256", f"train.init_from={work / 'source'}"],
        r"its draft_vocab_size is 512 \(.*config.json: draft_vocab_size\), this run's is 256; "
        r"set train.draft_vocab_size",
    )
    _expect_refusal([f"train.init_from={work / 'nothing'}"], "no draft there")


def test_a_warm_start_from_an_original_eagle3_repository(kimi_data: Path, run_in) -> None:
    """An original EAGLE-3 layout (LlamaForCausalLMEagle3 config, ``midlayer.*`` tensors,
    as SafeAILab's trainer writes it) is converted by speculators' converter and the run
    starts from exactly its weights."""
    from safetensors.torch import load_file, save_file

    from eagle3_pipeline.stages.train import main
    from eagle3_pipeline.train.distributed import init_distributed
    from eagle3_pipeline.train.loop import DraftTrainer
    from eagle3_pipeline.train.plan import plan_training

    work = run_in(kimi_data)
    plain = [*REDUCED, "train.epochs=1", "train.max_steps=2", "train.draft.norm_before_fc=false"]
    plain += ["train.draft.norm_output=false", "train.draft.norm_before_residual=false"]
    main(plain)
    ours = json.loads((work / "data/draft/config.json").read_text())
    layer = ours["transformer_layer_config"]
    weights = load_file(str(work / "data/draft/model.safetensors"))
    original = work / "original"
    original.mkdir()
    renamed = {k.replace("layers.0.", "midlayer."): v for k, v in weights.items()}
    save_file(renamed, str(original / "model.safetensors"))
    (original / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLMEagle3"],
                "model_type": "llama",
                **{
                    k: layer[k]
                    for k in (
                        "hidden_size",
                        "intermediate_size",
                        "num_attention_heads",
                        "num_key_value_heads",
                        "head_dim",
                        "rms_norm_eps",
                        "max_position_embeddings",
                    )
                },
                "num_hidden_layers": 1,
                "draft_vocab_size": ours["draft_vocab_size"],
                "eagle_aux_hidden_state_layer_ids": ours["eagle_aux_hidden_state_layer_ids"],
                "torch_dtype": "float32",
            }
        )
    )
    shutil.rmtree(work / "data/train_state")
    config = load_config([*plain, f"train.init_from={original}"])
    plan = plan_training(TrainInputs.from_config(config))
    assert plan.init is not None and plan.init.format == "eagle3"
    assert plan.init_dir == Path("data/train_state/init_converted")
    model = DraftTrainer(plan, init_distributed("cpu"), progress=False).model
    state = model.state_dict()
    for name, tensor in weights.items():
        torch.testing.assert_close(state[name], tensor, rtol=0, atol=0, msg=name)


def _bounds(node: Any, prefix: str) -> list[tuple[str, Any, str]]:
    """``(key, value, which bound)`` for each bounded (:func:`setting`) field under ``node``: the value
    at each of its declared bounds (just inside a strict one)."""
    import dataclasses

    out: list[tuple[str, Any, str]] = []
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            out += _bounds(value, f"{key}.")
        bounds = f.metadata.get("bounds")
        if bounds is None:
            continue
        ge, gt, le, lt = bounds
        is_int = "int" in str(f.type) and "float" not in str(f.type)
        step = 1 if is_int else 1e-3
        for bound, offset, name in (
            (ge, 0, "ge"),
            (gt, step, "gt"),
            (le, 0, "le"),
            (lt, -step, "lt"),
        ):
            if bound is not None:
                at = bound + offset
                out.append((key, int(at) if is_int else float(at), name))
    return out


def test_every_value_the_schema_accepts_passes_the_train_plan(kimi_data: Path, run_in) -> None:
    """The schema is where refusals live: each bounded key that the train stage reads, set
    at each of its bounds, either composes and passes the train stage's plan on the tiny
    Kimi, or is refused while composing (a rule across keys) -- never accepted at compose
    and refused later by the stage."""
    from eagle3_pipeline.train.errors import TrainingError
    from eagle3_pipeline.train.plan import plan_training

    # Refusals that need what only an earlier stage knows, each with the fact it needs;
    # any other late refusal fails the test.
    after_compose = {
        "train.draft.hidden_size": "the target's width (an EAGLE-3 draft shares it)",
        "train.val_fraction": "the number of prepared rows (one row on each side)",
    }
    run_in(kimi_data)
    base = load_config(REDUCED)
    cases = [c for c in _bounds(base.train, "train.") + _bounds(base.hardware, "hardware.")]
    assert len(cases) > 20  # the walk finds the schema's bounds
    late: list[str] = []
    for key, value, bound in cases:
        try:
            cfg = load_config([*REDUCED, f"{key}={value}"])
        except ConfigError:
            continue  # refused at compose: where a refusal belongs
        try:
            plan_training(TrainInputs.from_config(cfg))
        except (ConfigError, TrainingError) as exc:
            if key not in after_compose:
                late.append(f"{key}={value} ({bound}): {exc}")
    assert not late, "\n".join(late)
