"""Real vLLM (its CPU build, in the separate vLLM environment) on the tiny Kimi-K2.5:
extraction through ``vllm serve`` equals the hf backend, regeneration through ``vllm serve``
equals transformers' greedy, the served and the offline validation paths give the same
spec-decode counters, and a server that cannot start says why in one line."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import warnings
from pathlib import Path

import pytest
import torch
from extract_work import config, workdir_for
from safetensors.torch import load_file

from eagle3_pipeline.core.config import load_config
from eagle3_pipeline.core.errors import StageError
from eagle3_pipeline.extract import vllm_backend as V
from eagle3_pipeline.extract.hf_backend import extract_hf
from eagle3_pipeline.extract.rows import load_rows
from eagle3_pipeline.serving.engine import build_engine
from eagle3_pipeline.serving.env import find_python
from eagle3_pipeline.serving.offline import Pass, VllmRunError, run_offline
from eagle3_pipeline.targets.adapter import load_target_spec
from eagle3_pipeline.validate.acceptance import load_prompts
from eagle3_pipeline.validate.run import stop_token_ids
from eagle3_pipeline.validate.vllm import VllmError, run_served

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load(overrides: list[str]):
    return load_config(overrides, conf_dir=REPO / "conf")


def _in(workdir: Path, fn, *args):
    old = os.getcwd()
    os.chdir(workdir)
    try:
        return fn(*args)
    finally:
        os.chdir(old)


def test_vllm_extraction_equals_the_hf_backend(tiny_target, tmp_path):
    """Same rows, same layers: files written through vLLM's extract_hidden_states server
    (CPU connector) equal the hf backend's after the cast to the stored dtype (bf16),
    within one bf16 rounding step, with token ids equal to the rows."""
    hf_wd = workdir_for(tiny_target, tmp_path / "hf", n=4)
    vl_wd = workdir_for(tiny_target, tmp_path / "vllm", n=4)
    _in(hf_wd, extract_hf, config(hf_wd), False)
    cfg = config(
        vl_wd,
        "extract.backend=vllm",
        f"extract.server.port={_free_port()}",
        "extract.server.concurrency=2",
    )
    metrics = _in(vl_wd, V.extract_vllm, cfg)
    assert metrics.samples_written == 4 and metrics.backend == "vllm"
    rows = load_rows(vl_wd / "data/prepared", 1 << 30)
    equal = total = 0
    for i in range(4):
        a = load_file(hf_wd / f"data/hidden_states/hs_{i}.safetensors")
        b = load_file(vl_wd / f"data/hidden_states/hs_{i}.safetensors")
        assert torch.equal(b["token_ids"], a["token_ids"])
        assert b["token_ids"].tolist() == list(rows.input_ids([i])[0])
        ha, hb = a["hidden_states"].float(), b["hidden_states"].float()
        assert b["hidden_states"].dtype == a["hidden_states"].dtype == torch.bfloat16
        assert ha.shape == hb.shape
        # one bf16 step (2^-7 relative) on values rounded from slightly different fp32 sums
        assert ((ha - hb).abs() <= ha.abs() * 2**-7 + 1e-4).all(), (ha - hb).abs().max()
        equal += int((ha == hb).sum())
        total += ha.numel()
    assert equal / total > 0.99, equal / total
    assert not (vl_wd / "data/hidden_states" / V.STAGING).exists()
    # the train stage's loader (speculators') reads them unchanged, every sample
    from hs_connectors import FileTransfer
    from speculators.train.data import ArrowDataset
    from speculators.train.recovery import SampleUnavailable

    ds = ArrowDataset(
        max_len=512,
        datapath=str(vl_wd / "data/prepared"),
        transfer=FileTransfer(vl_wd / "data/hidden_states"),
        on_missing="raise",
        hidden_states_dtype=torch.float32,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a dropped (mismatched) sample only warns
        assert not any(isinstance(ds[i], SampleUnavailable) for i in range(len(ds)))
    assert len(ds) == 4


def test_regeneration_through_vllm_serve_equals_transformers(tiny_target, tmp_path):
    """The prepare stage with ``data.regenerate_backend=server`` (and ``start``): vLLM's
    greedy answers give the same rows, token for token, as the in-process hf backend."""
    from eagle3_pipeline.data.prepare import prepare

    port = _free_port()
    common = ["train.samples=6", "data.max_new_tokens=16", "data.heldout_size=2"]
    rows = {}
    for name, extra in (
        ("hf", []),
        (
            "server",
            [
                "data.regenerate_backend=server",
                "data.server.start=true",
                f"data.server.base_url=http://127.0.0.1:{port}/v1",
                "data.server.concurrency=2",
            ],
        ),
    ):
        wd = tmp_path / name
        (wd / "data").mkdir(parents=True)
        (wd / "data/target").symlink_to(tiny_target / "data/target")
        cfg = _in(wd, _load, [*common, *extra])
        m = _in(wd, prepare, cfg, False)
        assert m.backend == name
        rows[name] = load_rows(wd / "data/prepared", 1 << 30)
    a, b = rows["hf"], rows["server"]
    assert len(a) == len(b) > 0
    assert [list(x) for x in a.input_ids(range(len(a)))] == [
        list(x) for x in b.input_ids(range(len(b)))
    ]


def test_served_and_offline_validation_give_the_same_counters(validate_workdir):
    """One engine description, two ways to run it: ``vllm serve`` + HTTP and ``vllm.LLM``
    in the worker. Same greedy outputs, same spec-decode counters."""
    wd = validate_workdir
    cfg = _in(wd, _load, [])
    spec = load_target_spec(wd / "data/target/target.json")
    spec = dataclasses.replace(spec, path=str(wd / spec.path))
    engine = build_engine(
        cfg, spec, spec.path, "validate", dtype="float32", draft_dir=wd / "data/draft", k=3
    )
    prompts = [p.prompt_ids for p in load_prompts(wd / "data/heldout/prompts.jsonl")]
    stops = stop_token_ids(spec.path)
    python = find_python()
    # labels (a prompt set / category / turn per prompt): counters per label, both ways
    labels = ["a", "b", "a"][: len(prompts)]
    # passes on the same engines: sampled at T=0.7 (seeded, per label), then 2 in flight,
    # then 2 in flight one label at a time (validate.counting_concurrency), then a subset
    # in the order given (validate.speed_prompts)
    passes = [
        Pass("sampled", 0.7, 7, labels=True),
        Pass("c2", concurrency=2),
        Pass("c2_labels", concurrency=2, labels=True),
        Pass("subset", subset=(2, 0)),
    ]
    offline = run_offline(
        python, engine, prompts, 12, stops, wd / "logs/offline.log", labels=labels, passes=passes
    )
    served = run_served(
        python,
        engine,
        _free_port(),
        prompts,
        12,
        stops,
        wd / "logs/served.log",
        600,
        30,
        labels=labels,
        passes=passes,
    )
    assert offline.outputs == served.outputs
    assert offline.counters == served.counters
    assert offline.counters["drafts"] > 0
    assert offline.group_counters == served.group_counters
    assert sorted(offline.group_counters) == sorted(set(labels))
    assert sum(g["drafts"] for g in offline.group_counters.values()) == offline.counters["drafts"]
    assert offline.env["VLLM_MLA_DISABLE"] == "1"  # the workaround reached the engine
    for run in (offline, served):
        sampled, both = run.passes["sampled"], run.passes["c2"]
        # the sampled pass's own counters, per label too, and its figures are theirs
        assert sampled.counters["drafts"] > 0
        assert sorted(sampled.group_counters) == sorted(set(labels))
        assert (
            sum(g["drafts"] for g in sampled.group_counters.values())
            == (sampled.counters["drafts"])
        )
        assert [len(o) > 0 for o in sampled.outputs] == [True] * len(prompts)
        # two in flight: every prompt answered, the draft used, tokens/s measured
        assert both.concurrency == 2 and len(both.outputs) == len(prompts)
        assert both.counters["drafts"] > 0 and both.tokens_per_s > 0
    # the same seeds give the same samples, whichever way the engine is run
    assert offline.passes["sampled"].outputs == served.passes["sampled"].outputs
    for run in (offline, served):
        per_label = run.passes["c2_labels"]
        # in flight one label at a time: vLLM's counters per label, summing to the pass's
        assert sorted(per_label.group_counters) == sorted(set(labels))
        assert (
            sum(g["drafts"] for g in per_label.group_counters.values())
            == per_label.counters["drafts"]
            > 0
        )
        assert [len(o) > 0 for o in per_label.outputs] == [True] * len(prompts)
        # a subset: those prompts, in that order, as the single stream decoded them
        assert len(prompts) >= 3
        assert run.passes["subset"].outputs == [run.outputs[2], run.outputs[0]]


def test_a_vllm_that_cannot_start_says_why_in_one_line(validate_workdir, tmp_path):
    """Bad flag, port taken, unloadable model: one line with the cause from the log and
    the log's path."""
    wd = validate_workdir
    cfg = _in(wd, _load, [])
    spec = load_target_spec(wd / "data/target/target.json")
    spec = dataclasses.replace(spec, path=str(wd / spec.path))
    python = find_python()
    prompts = [[1, 2, 3]]
    bad = build_engine(cfg, spec, spec.path, "baseline", dtype="float32")
    bad.extra_args = ["--no-such-flag"]
    with pytest.raises(VllmError, match=r"exited with .*no-such-flag.*\(log .*bad_flag.log\)"):
        run_served(python, bad, _free_port(), prompts, 4, [], tmp_path / "bad_flag.log", 300, 10)
    broken = tmp_path / "broken"
    shutil.copytree(spec.path, broken)
    for shard in broken.glob("*.safetensors"):
        shard.write_bytes(b"not a safetensors file")
    eng = build_engine(
        cfg, dataclasses.replace(spec, path=str(broken)), broken, "baseline", dtype="float32"
    )
    with pytest.raises(VllmRunError) as exc:
        run_offline(python, eng, prompts, 4, [], tmp_path / "broken.log")
    msg = str(exc.value)
    assert "\n" not in msg and "broken.log" in msg and "exited with" in msg
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(
            VllmError,
            match=rf"validate.server.port={port}: port {port} on "
            r"127.0.0.1 is in use",
        ):
            run_served(
                python,
                dataclasses.replace(bad, extra_args=[]),
                port,
                prompts,
                4,
                [],
                tmp_path / "port.log",
                300,
                10,
            )


def test_a_started_server_is_private_and_shown_to_serve_the_target(validate_workdir, tmp_path):
    """``vllm serve`` as the stages start it: a per-run API key (requests without it get
    401; it is on no command line and in no log), the served model checked by name and
    token probe, another target refused naming both, and a second server on the same
    port refused before it starts."""
    import urllib.error
    import urllib.request

    from eagle3_pipeline.runtime.processes import group_members
    from eagle3_pipeline.serving.identity import ServerIdentityError, expected_model, verify_server
    from eagle3_pipeline.serving.server import engine_server

    wd = validate_workdir
    cfg = _in(wd, _load, [])
    spec = load_target_spec(wd / "data/target/target.json")
    spec = dataclasses.replace(spec, path=str(wd / spec.path))
    engine = build_engine(cfg, spec, spec.path, "baseline", dtype="float32")
    python, port, log = find_python(), _free_port(), tmp_path / "private.log"
    with engine_server(engine, python, port, log, 600, 30) as server:
        with pytest.raises(urllib.error.HTTPError) as denied:  # no key
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30)
        assert denied.value.code == 401
        key = server.api_key
        assert server.served_model == engine.served_model_name == spec.name
        assert server.proc is not None
        for pid in group_members(server.proc.pid):
            assert key.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        other = expected_model("tiny llama (/models/llama)", ("tiny-llama", "/models/llama"))
        with pytest.raises(
            ServerIdentityError,
            match=rf"serves {spec.name} \(.*\), not the "
            r"target tiny llama \(/models/llama\)",
        ):
            verify_server(f"{server.url}/v1", key, other)
        with pytest.raises(
            StageError,
            match=rf"validate.server.port={port}: port {port} on "
            r"127.0.0.1 is in use",
        ):
            with engine_server(
                engine,
                python,
                port,
                tmp_path / "second.log",
                600,
                30,
                port_key="validate.server.port",
            ):
                pass
    assert key not in log.read_text(errors="replace")


# The trained MLA draft's comparison: draft length, tokens per prompt, draft training steps.
MLA_K, MLA_MAX_NEW, MLA_DRAFT_STEPS = 3, 32, 60


def test_a_trained_mla_draft_in_float32_counts_in_vllm_what_our_evaluator_counts(
    tiny_target: Path, tmp_path: Path
) -> None:
    """``train.draft.layer_type=mla`` end to end on the tiny Kimi in float32: a trained MLA
    draft served by vLLM's CPU build (offline engine, as validation runs it) gives the same
    number of drafts and the same accepted tokens at EVERY position as our evaluator on the
    draft as saved, and the same tokens (lossless). Per-position acceptance is well above zero
    at every position and below one, so acceptances and rejections are compared at each.

    The target is the tiny Kimi's shape at one training step: the 30-step session target
    answers one token over and over, which any draft predicts after a few steps (every
    position 1.0, nothing rejected), while this one alternates between tokens, and a draft
    trained for 60 steps gets about 0.95 / 0.48 / 0.43. On a CPU with AMX tiles this is
    also issue 47's case: without the draft's own CPU_MLA the engine does not start
    (AMX_MLA refuses float32; ``tests/compat`` shows vLLM still does)."""
    from acceptance_setup import make_setup, train_draft

    from eagle3_pipeline.draft.checkpoint import load_trained_draft
    from eagle3_pipeline.targets.tiny import build_tiny_target
    from eagle3_pipeline.train.save import save_draft
    from eagle3_pipeline.validate.acceptance import SpeculatorsDraft, measure
    from eagle3_pipeline.validate.vllm import acceptance_figures

    wd = tmp_path / "w"
    shutil.copytree(tiny_target / "conf", wd / "conf")
    shutil.copytree(tiny_target / "data" / "target", wd / "data" / "target")
    cfg = _in(wd, _load, [])
    spec = load_target_spec(wd / "data/target/target.json")
    model_dir = wd / (spec.path or "")
    spec = dataclasses.replace(spec, path=str(model_dir))
    shutil.rmtree(model_dir)  # the same shape and tokenizer, trained one step
    one_step = dataclasses.replace(cfg.target, train_steps=1)
    build_tiny_target(cfg.model.tiny, one_step, model_dir, cfg.seed, progress=False)

    setup = make_setup(wd)
    try:
        trained = train_draft(setup, MLA_DRAFT_STEPS, layer_type="mla")
        draft_dir = wd / "data" / "draft"
        save_draft(trained, draft_dir, MLA_K)
        # our evaluator on the draft as saved and reloaded, as the validate stage runs it
        saved = load_trained_draft(draft_dir, model_dir, attn_implementation="sdpa")
        ours, per_prompt = measure(
            setup.target,
            SpeculatorsDraft(saved),
            setup.prompts,
            MLA_K,
            MLA_MAX_NEW,
            setup.stops,
            check_lossless=True,
        )
    finally:
        setup.target.close()
    assert ours.lossless is True
    assert all(r is not None and 0.2 < r < 1.0 for r in ours.per_position_rate), ours

    engine = build_engine(
        cfg, spec, model_dir, "validate", dtype="float32", draft_dir=draft_dir, k=MLA_K
    )
    assert engine.speculative_config is not None
    # both models ask for the reference MLA kernel (compat.vllm workaround 5)
    assert engine.attention_backend == engine.speculative_config.attention_backend == "CPU_MLA"
    assert "VLLM_MLA_DISABLE" not in engine.env  # an MLA draft keeps the target's MLA on
    run = run_offline(
        find_python(),
        engine,
        [p.prompt_ids for p in setup.prompts],
        MLA_MAX_NEW,
        setup.stops,
        tmp_path / "mla.log",
    )
    vllm = acceptance_figures(run.counters)
    summary = (
        f"vLLM {vllm.num_drafts} drafts, per position {vllm.num_accepted_tokens_per_pos}; "
        f"ours {ours.steps} steps, per position {ours.accepted_per_pos}"
    )
    print(summary)
    assert run.outputs == [r.tokens for r in per_prompt], summary
    assert vllm.num_drafts == ours.steps, summary
    assert vllm.num_draft_tokens == MLA_K * ours.steps, summary
    assert vllm.num_accepted_tokens_per_pos == ours.accepted_per_pos, summary
    assert vllm.num_accepted_tokens == ours.accepted, summary
    assert vllm.mean_acceptance_length == ours.vllm_style_acceptance_length, summary
