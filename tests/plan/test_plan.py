"""Plan figures against hand-computed values, the commands, and the not-fit cases."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from machines import cfg_for
from record_samples import extract_record, prepare_record, train_record

import eagle3_pipeline.tools.plan.cli as plan
import eagle3_pipeline.tools.plan.weights as weights
from eagle3_pipeline.core.config import Config, ConfigError
from eagle3_pipeline.core.metrics import details_path
from eagle3_pipeline.core.records import Record
from eagle3_pipeline.plan import resources, target_info
from eagle3_pipeline.preflight.hardware import TorchView
from eagle3_pipeline.preflight.record import DiskReading
from eagle3_pipeline.preflight.run import run_preflight
from eagle3_pipeline.preflight.view import PreflightInputs
from eagle3_pipeline.runtime.gpu import MemoryReader

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
FIXTURE = REPO / "tests" / "fixtures" / "kimi_k25"
# a hub dataset is not counted ahead, so these estimates scale with train.samples
KIMI = (
    "model=kimi_k25",
    "hardware=rtx_pro_6000_x8",
    f"model.path={FIXTURE}",
    "data.source=hf",
    "data.path=org/chat-set",
)
PLENTY = 10**15


def write_metrics(cfg: Config, record: Record) -> None:
    """An earlier run's details, as its stage writes them."""
    record.write(details_path(cfg, record.STAGE))


# --------------------------------------------------------------------------- storage


def test_kimi_bytes_per_token_three_aux_plus_final_bf16(tmp_path):
    cfg = cfg_for(tmp_path, *KIMI, "train.samples=1000")
    target = target_info.load_target(cfg.model)
    s = resources.estimate_storage(cfg, target)
    assert target.captured_layer_ids == [2, 30, 58, 61]
    assert s.bytes_per_token == 4 * 7168 * 2 == 57_344  # 56 KiB
    assert s.upper_bound and "upper bound" in s.basis
    assert s.total_tokens == 1000 * cfg.data.max_seq_len
    assert s.total_bytes == 1000 * cfg.data.max_seq_len * (57_344 + 8)


def test_measured_tokens_per_row_replace_the_upper_bound(tmp_path):
    cfg = cfg_for(tmp_path, *KIMI, "train.samples=1000")
    write_metrics(cfg, prepare_record(mean_tokens_per_row=2048, rows=500, conversations_train=250))
    s = resources.estimate_storage(cfg, target_info.load_target(cfg.model))
    assert not s.upper_bound and s.basis.startswith("measured")
    assert s.rows_per_conversation == 2.0
    assert s.total_tokens == 1000 * 2048 * 2
    # 1000 samples of 2k tokens is about 115 GB (here 2 rows per conversation)
    assert s.total_bytes == 1000 * 2048 * 2 * (57_344 + 8)
    # one row per conversation
    write_metrics(cfg, prepare_record(mean_tokens_per_row=2048, rows=250, conversations_train=250))
    assert (
        resources.estimate_storage(cfg, target_info.load_target(cfg.model)).total_tokens
        == 2_048_000
    )


def test_the_estimate_is_bounded_by_the_data_actually_selected(tmp_path):
    """A 9-line file trains on at most 9 - held out conversations, whatever train.samples
    says (it once demanded 160 GB for such a file)."""
    data = tmp_path / "nine.jsonl"
    line = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    data.write_text("".join(json.dumps(line) + "\n" for _ in range(9)) + "\n")
    cfg = cfg_for(
        tmp_path,
        "model=kimi_k25",
        "hardware=rtx_pro_6000_x8",
        f"model.path={FIXTURE}",
        "data.source=file",
        f"data.path={data}",
        "data.heldout_size=2",
        "train.samples=100000",
    )
    target = target_info.load_target(cfg.model)
    s = resources.estimate_storage(cfg, target)
    assert s.samples == 7 and s.total_tokens == 7 * cfg.data.max_seq_len
    assert "7 conversations: 9 records in the data less data.heldout_size=2" in s.basis
    need = resources.disk_need(cfg, s, resources.estimate_draft(cfg, target), lambda _: PLENTY)
    assert need.hidden_states_bytes == 7 * 512 * (57_344 + 8) < 10**9
    # the builtin corpus is counted too; a JSON document by its list
    builtin = cfg_for(tmp_path, "train.samples=100000")
    assert (
        resources.estimate_storage(builtin, target_info.load_target(builtin.model)).samples < 1000
    )
    doc = tmp_path / "three.json"
    doc.write_text(json.dumps({"data": [line, line, line]}))
    cfg.data.path = str(doc)
    assert resources.estimate_storage(cfg, target).samples == 1


def test_tiny_target_shape_without_building_anything(tmp_path):
    cfg = cfg_for(tmp_path)
    target = target_info.load_target(cfg.model)
    assert target.spec.num_layers == 4 and target.spec.hidden_size == 128
    assert target.spec.aux_layer_ids == [1, 2, 3]  # resolve_aux_layer_ids(4, None)
    assert target.captured_layer_ids == [1, 2, 3, 4]
    s = resources.estimate_storage(cfg, target)
    assert s.bytes_per_token == 4 * 128 * 2
    llama = target_info.load_target(cfg_for(tmp_path, "model=tiny_llama").model)
    assert llama.spec.attention == "standard" and llama.spec.num_key_value_heads == 2


def test_hf_cache_lookup_and_the_clear_failure(tmp_path):
    cfg = cfg_for(tmp_path, "model=kimi_k25")
    with pytest.raises(ConfigError, match=r"pass model\.path=DIR"):
        target_info.load_target(cfg.model, hf_cache=tmp_path / "cache")
    sha = "a" * 40
    repo = tmp_path / "cache" / "models--moonshotai--Kimi-K2.5"
    shutil.copytree(FIXTURE, repo / "snapshots" / sha)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)
    target = target_info.load_target(cfg.model, hf_cache=tmp_path / "cache")
    assert target.spec.num_layers == 61 and target.source.startswith("HF cache")


# --------------------------------------------------------------------------- draft, serving


def test_draft_parameters_and_memory_hand_computed(tmp_path):
    cfg = cfg_for(tmp_path, *KIMI)
    d = resources.estimate_draft(cfg, target_info.load_target(cfg.model))
    h, heads, kv, hd, inter, dv, v = 7168, 64, 64, 112, 14336, 1024, 163840
    assert (d.num_heads, d.num_kv_heads, d.head_dim, d.intermediate_size) == (heads, kv, hd, inter)
    assert d.head_dim != 64 and d.intermediate_size != 18432  # not inherited from MLA / dense
    layer = 2 * h * (heads + 2 * kv) * hd + heads * hd * h + 3 * h * inter + 3 * h
    # fc, the layer, the final norm, the draft lm_head, and norm_before_fc's RMSNorm over
    # the three aux states (on by default)
    trainable = 3 * h * h + layer + h + dv * h + 3 * h
    assert d.params_trainable == trainable
    assert d.params_total == trainable + v * h
    assert d.optimizer_bytes == 8 * trainable
    assert d.weights_bytes == 2 * (trainable + v * h)  # bf16 on this profile
    assert (
        d.train_memory_bytes
        == d.weights_bytes + d.grads_bytes + d.optimizer_bytes + d.activation_bytes
    )


def test_kimi_serving_weights_int4_experts(tmp_path):
    cfg = cfg_for(tmp_path, *KIMI)
    w = weights.estimate_target_weights(target_info.load_target(cfg.model))
    experts = 60 * 384 * 3 * 7168 * 2048  # 60 MoE layers (first_k_dense_replace=1)
    assert w.expert_params == experts
    assert w.expert_bytes == pytest.approx(experts * (4 / 8 + 2 / 32))  # INT4 + bf16 scale / 32
    assert 1.0e12 < w.params < 1.05e12  # "1T parameters"
    s = weights.estimate_serving(cfg, w)
    assert s.gpus_used == 8 and s.expert_parallel
    assert s.weights_per_gpu_bytes == pytest.approx(w.bytes_total / 8)
    assert s.usable_per_gpu_bytes == pytest.approx(97887 * 2**20 * 0.9)
    assert 0 < s.headroom_per_gpu_bytes < s.usable_per_gpu_bytes


QWEN3_MOE = REPO / "tests" / "fixtures" / "qwen3_30b_a3b"


def _qwen3_moe(tmp_path, config: dict | None = None) -> target_info.TargetInfo:
    """Qwen/Qwen3-30B-A3B from its public config.json (optionally changed)."""
    src = QWEN3_MOE
    if config is not None:
        src = tmp_path / "qwen3_moe"
        src.mkdir(parents=True)
        (src / "config.json").write_text(json.dumps(config))
    cfg = cfg_for(tmp_path, "model=qwen3_8b", "model.name=qwen3_30b_a3b", f"model.path={src}")
    return target_info.load_target(cfg.model)


def test_qwen3_30b_a3b_weight_estimate_is_the_published_30_5b(tmp_path):
    target = _qwen3_moe(tmp_path)
    assert target.family.name == "qwen3_moe" and target.spec.num_experts == 128
    w = weights.estimate_target_weights(target)
    h, layers, experts, moe_inter, v = 2048, 48, 128, 768, 151936
    attention = h * 32 * 128 + 2 * h * 4 * 128 + 32 * 128 * h + 2 * 128  # + q/k norms
    per_layer = attention + experts * 3 * h * moe_inter + experts * h + 2 * h  # no router bias
    # 30,532,122,624: what transformers' Qwen3MoeForCausalLM counts for this config
    assert w.params == layers * per_layer + 2 * v * h + h == 30_532_122_624
    assert w.params == pytest.approx(30.5e9, rel=0.01)  # the model card's "30.5B in total"
    assert w.expert_params == layers * experts * 3 * h * moe_inter
    assert w.bytes_total == pytest.approx(2 * w.params)  # bf16, unquantized


def test_decoder_sparse_step_2_makes_half_the_layers_moe(tmp_path):
    config = json.loads((QWEN3_MOE / "config.json").read_text())
    every = weights.count_params(_qwen3_moe(tmp_path / "a", config))
    config["decoder_sparse_step"] = 2
    half = weights.count_params(_qwen3_moe(tmp_path / "b", config))
    assert every.moe_layers == tuple(range(48))
    assert half.moe_layers == tuple(range(1, 48, 2))  # (i + 1) % 2 == 0
    assert half.experts * 2 == every.experts
    assert half.num_dense == 24  # dense MLP of intermediate_size on the others
    assert half.total == every.total - every.experts // 2 - 24 * 128 * 2048 + 24 * 3 * 2048 * 6144


def test_time_assumptions_and_measured_replacement(tmp_path):
    cfg = cfg_for(tmp_path, *KIMI, "train.samples=1000", "train.epochs=10")
    s = resources.estimate_storage(cfg, target_info.load_target(cfg.model))
    ext, trn = resources.estimate_time(cfg, s)
    # the profile's assumption: 10 epochs over 1,000 samples at 6 conversations/s, ~28 min
    assert trn.seconds == pytest.approx(10 * 1000 / 6.0) and trn.source.startswith("assumption")
    assert ext.seconds == pytest.approx(s.total_tokens / 2900.0)
    # the train stage measures tokens/s: 10 conversations/s worth of tokens
    tokens_per_s = 10.0 * s.tokens_per_conversation
    write_metrics(
        cfg,
        train_record(tokens_per_s=tokens_per_s, hardware="rtx_pro_6000_x8", target=cfg.model.name),
    )
    write_metrics(cfg, extract_record(tokens_per_s=5000.0, hardware="cpu", target=cfg.model.name))
    ext, trn = resources.estimate_time(cfg, s)
    assert trn.seconds == pytest.approx(1000.0) and trn.source.startswith("measured")
    assert ext.source.startswith("assumption")  # measured on another profile: ignored


# --------------------------------------------------------------------------- plan


def test_plan_commands_for_the_kimi_profile(tmp_path):
    cfg = cfg_for(tmp_path, *KIMI)
    p = plan.build_plan(cfg, list(KIMI), free_fn=lambda _: PLENTY)
    assert p.fits, p.problems
    c = p.data["commands"]
    assert c["extract_server"].startswith(f"vllm serve {FIXTURE} ")
    for part in (
        "--trust-remote-code",
        "--dtype bfloat16",
        "--tensor-parallel-size 8",
        "--enable-expert-parallel",
        '"method":"extract_hidden_states"',
        '"eagle_aux_hidden_state_layer_ids":[2,30,58,61]',
        "--kv-transfer-config",
        '"kv_connector":"ExampleHiddenStatesConnector"',
    ):
        assert part in c["extract_server"]
    assert c["train"][0].startswith("python -m eagle3_pipeline.stages.train --params params.yaml")
    assert c["train"][1] == (
        "torchrun --standalone --nproc_per_node 8 -m eagle3_pipeline.train.worker --params "
        f"params.yaml --out {cfg.data_dir}/train_state/rank0_metrics.json"
    )
    assert (
        '--speculative-config \'{"method":"eagle3","model":"' + cfg.data_dir + '/draft",'
        '"num_speculative_tokens":3}\''
    ) in c["serve_draft"]
    assert c["upload"][0].startswith("hf upload YOUR_ORG/Kimi-K2.5-EAGLE3 ")
    assert c["upload"][1].startswith("huggingface-cli upload ")


def test_multi_node_prints_one_train_stage_per_node(tmp_path):
    cfg = cfg_for(tmp_path, *KIMI, "hardware.nodes=2")
    p = plan.build_plan(cfg, free_fn=lambda _: PLENTY)
    train = p.data["commands"]["train"]
    assert len(train) == 2
    assert (
        train
        == p.data["modes"]["two_nodes"]["offline"][
            "train: each node's stage starts one torchrun agent (--nnodes 2)"
        ][:2]
    )
    assert train[0].startswith("EAGLE3_NODE_RANK=0 ") and train[1].endswith("# node 1")


def test_plan_and_preflight_share_the_disk_estimate(tmp_path):
    cfg = cfg_for(tmp_path, *KIMI)
    p = plan.build_plan(cfg, free_fn=lambda _: PLENTY)
    pf = run_preflight(
        PreflightInputs.from_config(cfg),
        reader=MemoryReader([]),
        env={},
        torch_probe=lambda: TorchView("2.14.1", "12.8", 0),
        free_fn=lambda _: PLENTY,
        versions={},
    )
    disk = pf.metrics.disk
    assert isinstance(disk, DiskReading)
    assert disk.need_bytes == p.data["storage"]["disk"]["need_bytes"]


def test_cli_kimi_plan_prints_and_writes(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "eagle3_pipeline.tools.plan.cli",
            *KIMI,
            "train.samples=1000",
            f"data_dir={tmp_path / 'data'}",
            f"metrics_dir={tmp_path / 'metrics'}",
            "--out",
            str(tmp_path / "plan"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    assert "57,344 = 4 x 7,168 x 2 (bfloat16)" in out.stdout
    assert "vllm serve" in out.stdout and "torchrun" in out.stdout
    data = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert data["storage"]["bytes_per_token"] == 57_344
    assert data["target"]["nested"] is True and data["target"]["num_layers"] == 61


def test_plan_without_a_config_says_what_to_pass(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    rc = plan.main(["--conf-dir", str(CONF), "model=kimi_k25"])
    assert rc == 2
    assert "pass model.path=DIR" in capsys.readouterr().err


def _main(tmp_path, *args, free=PLENTY):
    return plan.main(
        [
            "--conf-dir",
            str(CONF),
            f"data_dir={tmp_path / 'data'}",
            f"metrics_dir={tmp_path / 'metrics'}",
            "--out",
            str(tmp_path / "plan"),
            *args,
        ],
        free_fn=lambda _: free,
    )


def test_disk_too_small_one_line_and_strict_exit(tmp_path, capsys):
    args = (*KIMI, "train.samples=1000")
    assert _main(tmp_path, *args, free=20 * 10**9) == 0  # reported, not fatal
    assert _main(tmp_path, *args, "--strict", free=20 * 10**9) == 1
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("PROBLEM ")]
    assert len(lines) == 2  # one per run
    assert lines[-1].startswith("PROBLEM disk: need ") and "have 20.0 GB" in lines[-1]
    assert _main(tmp_path, *args, "--strict") == 0


def test_draft_too_large_for_the_gpus(tmp_path, capsys):
    rc = _main(tmp_path, *KIMI, "hardware.gpu_memory_mib=4000", "--strict")
    assert rc == 1
    problems = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("PROBLEM ")]
    kinds = [ln.split(":")[0] for ln in problems]
    assert kinds == ["PROBLEM draft", "PROBLEM serving"]
    assert "per process, a RTX PRO 6000 Blackwell GPU has 3.9 GiB" in problems[0]


def test_both_hidden_state_modes_for_kimi_on_8_rtx_pro_6000(tmp_path):
    """Offline keeps every token's states on disk; online keeps none and shares the GPUs:
    vLLM's weights per GPU + an extraction allowance, the trainer beside it."""
    cfg = cfg_for(tmp_path, *KIMI, "train.samples=500000")
    p = plan.build_plan(cfg, list(KIMI), free_fn=lambda _: PLENTY)
    m, s = p.data["modes"], p.data["storage"]
    assert m["offline"]["hidden_states_bytes"] == s["total_bytes"] > 10e12  # tens of TB
    on = m["online"]
    assert on["hidden_states_bytes"] == 0
    # in flight: (2 prefetched + 1 training) batches of 1,024 tokens on each of 8 ranks
    assert on["staging_bytes"] == 3 * 1024 * 57_344 * 8
    one = on["one_node"]
    w = p.data["serving"]["weights_per_gpu_bytes"]
    gpu = 97_887 * 1024**2
    assert one["gpu_bytes"] == gpu and one["fits"]
    assert one["vllm_gpu_memory_utilization"] == math.ceil((w + 6 * 1024**3) / gpu * 100) / 100
    assert one["vllm_bytes_per_gpu"] + one["train_bytes_per_gpu"] <= 0.95 * gpu
    assert "-S extract.mode=online -S hardware.serving.gpu_memory_utilization=0.79" in on["command"]
    assert "--gpu-memory-utilization 0.79" in on["stage_runs"][0]
    text = plan.render_plan(p)
    assert "online disk" in text and "[2 nodes]" in text


def test_two_nodes_print_per_node_commands(tmp_path):
    """A GPU profile prints the two-node layout it grows into: each node extracts its share
    through vLLM, then every node runs the same train stage, told its rank by the
    environment. Online hidden states are not offered over nodes, and the plan says so."""
    cfg = cfg_for(tmp_path, *KIMI)
    two = plan.build_plan(cfg, list(KIMI), free_fn=lambda _: PLENTY).data["modes"]["two_nodes"]
    extract, train = two["offline"].values()
    assert [c.endswith(f"# node {r}") for r, c in enumerate(extract[:2])] == [True, True]
    assert "extract.backend=vllm extract.rank=1 extract.world_size=2" in extract[1]
    assert train[1] == (
        "EAGLE3_NODE_RANK=1 EAGLE3_MASTER_ADDR=$NODE0 EAGLE3_MASTER_PORT=29500 "
        "python -m eagle3_pipeline.stages.train --params params.yaml   # node 1"
    )
    assert train[2].startswith("dvc commit -f train && eagle3-remote push")
    assert two["online"].startswith("not offered over nodes")
    # a CPU profile prints it only when asked for nodes, with its own backend
    cpu = plan.build_plan(cfg_for(tmp_path, "hardware=cpu"), free_fn=lambda _: PLENTY)
    assert "two_nodes" not in cpu.data["modes"]
    three = cfg_for(tmp_path, "hardware=cpu", "hardware.nodes=3")
    m = plan.build_plan(three, free_fn=lambda _: PLENTY).data["modes"]["two_nodes"]
    extract, train = m["offline"].values()
    assert "extract.backend" not in extract[0] and "extract.world_size=3" in extract[2]
    assert [c.split()[0] for c in train[:3]] == [f"EAGLE3_NODE_RANK={r}" for r in range(3)]
