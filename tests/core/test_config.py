"""The one loader: conf/ + overrides and params.yaml give the same validated config."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from eagle3_pipeline.core.config import (
    Config,
    ConfigError,
    compose,
    compose_yaml,
    load_config,
    load_params,
)

REPO = Path(__file__).resolve().parents[2]


def test_committed_params_yaml_is_in_sync_with_conf():
    expected = compose_yaml(conf_dir=REPO / "conf")
    actual = (REPO / "params.yaml").read_text(encoding="utf-8")
    assert actual == expected, "params.yaml is stale: run `eagle3-compose` and commit it"


def test_default_config_is_the_embedded_tiny_kimi_on_cpu():
    cfg = load_config(conf_dir=REPO / "conf")
    assert isinstance(cfg, Config)
    assert cfg.model.name == "tiny_kimi_k25" and cfg.model.tiny is not None
    assert cfg.model.tiny.architecture == "kimi_k25"
    assert cfg.hardware.name == "cpu" and cfg.hardware.gpu_count == 0
    assert cfg.data.source == "builtin"


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["train.epochs=1", "model=tiny_llama"],
        ["model=kimi_k25", "hardware=rtx_pro_6000_x8", "train.samples=1000"],
        ["hardware=h200_x1", "model=qwen3_8b", "model.aux_layer_ids=[1,5,9]"],
    ],
)
def test_params_file_and_direct_overrides_give_the_same_config(tmp_path, overrides):
    """What `dvc exp run -S` writes to params.yaml == what a direct stage run composes."""
    params = tmp_path / "params.yaml"
    params.write_text(compose_yaml(overrides, conf_dir=REPO / "conf"))
    assert load_params(params) == load_config(overrides, conf_dir=REPO / "conf")


def test_real_target_profiles_name_hub_id_and_remote_code():
    kimi = load_config(["model=kimi_k25", "hardware=rtx_pro_6000_x8"], conf_dir=REPO / "conf")
    assert kimi.model.hub_id == "moonshotai/Kimi-K2.5" and kimi.model.trust_remote_code
    hw = kimi.hardware
    assert (hw.gpu_count, hw.gpu_memory_mib, hw.min_compute_capability) == (8, 97887, 12.0)
    s = hw.serving
    assert s.tensor_parallel_size * s.pipeline_parallel_size * s.data_parallel_size == 8
    assert s.enable_expert_parallel


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["train.sampels=5"], "sampels"),
        (["train.samples=abc"], "train.samples"),
        (["model=nope"], "model/nope"),
        (["hardware.device=tpu"], "hardware.device"),
        (["train.samples=0"], "train.samples"),
        (["model.tiny=null"], "model"),
        # declared bounds (core.config.setting), checked wherever the config is composed
        (["validate.k=0"], "validate.k=0 must be >= 1 (or null)"),
        (["validate.num_prompts=0"], "validate.num_prompts=0 must be >= 1 (or null)"),
        (["validate.max_new_tokens=0"], "validate.max_new_tokens=0 must be >= 1"),
        (["train.val_fraction=1.0"], "train.val_fraction=1.0 must be < 1"),
        # refused at compose, not by train after target, prepare and extract have run
        (["train.val_fraction=0"], "train.val_fraction=0.0 must be > 0"),
        (["train.tokens_per_step=8"], "train.tokens_per_step=8 must be >= 16"),
        (["train.lr=0"], "train.lr=0.0 must be > 0"),
        (
            ["hardware.serving.gpu_memory_utilization=1.5"],
            "hardware.serving.gpu_memory_utilization=1.5 must be <= 1",
        ),
        (["validate.server.port=70000"], "validate.server.port=70000 must be <= 65535"),
        (["train.nproc=0"], "train.nproc=0 must be >= 1 (or null)"),
        # cross-key rules
        (["validate.k_sweep=[0,2]"], "validate.k_sweep"),
        (["validate.k_sweep=[]"], "validate.k_sweep is empty"),
        (["train.speculative_tokens=3", "validate.k_sweep=[2,2]"], "a K is named twice"),
        # temperatures vLLM refuses (< 0) or silently raises to 0.01 (a mislabelled figure)
        (["validate.temperature=-0.5"], "validate.temperature=-0.5 must be >= 0.01 (or null)"),
        (["validate.temperature=0"], "validate.temperature=0.0 must be >= 0.01 (or null)"),
        (["validate.temperature=0.005"], "validate.temperature=0.005 must be >= 0.01"),
        (["validate.concurrency=[]"], "validate.concurrency is empty"),
        (["validate.concurrency=[1,0]"], "validate.concurrency=[1, 0]: [0] below 1"),
        (["validate.concurrency=[4,4]"], "validate.concurrency=[4, 4]: a level is named twice"),
        (["validate.kv_cache=false"], "needs validate.evaluator=chained"),
        (["validate.evaluator=replayed"], "validate.evaluator"),
        (["validate.batch_size=0"], "validate.batch_size=0 must be >= 1"),
        (["train.attn_implementation=simple_flex_attention"], "has no CPU backward"),
        (["extract.rank=1"], "extract.rank=1 must be < extract.world_size=1"),
        (
            ["extract.mode=online", "extract.world_size=2"],
            "online mode has no extraction to split",
        ),
        (["train.draft.norm_before_fc=true", "train.draft.fc_norm=true"], "exclusive"),
        (["train.draft.layer_type=mla", "train.draft.norm_before_fc=true"], "no norm before fc"),
        (["train.init_from=data/draft"], "train's own output (paths.draft)"),
        (["train.init_from=./data/train_state/x"], "train's own output (paths.train_state)"),
        # train.loss: a speculators loss name, or a JSON dict of them to weights
        (["train.loss=kld"], "train.loss='kld'"),
        (['train.loss=\'{"ce": 0.1, "xx": 1}\''], "'xx'"),
    ],
)
def test_bad_config_is_refused_naming_the_key(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_config(overrides, conf_dir=REPO / "conf")
    msg = str(err.value)
    assert needle in msg and "\n" not in msg


def test_a_loss_mix_of_known_names_is_accepted():
    cfg = load_config(['train.loss=\'{"ce": 0.1, "tv": 0.9}\''], conf_dir=REPO / "conf")
    assert json.loads(cfg.train.loss) == {"ce": 0.1, "tv": 0.9}


def test_params_file_with_unknown_key_is_refused(tmp_path):
    data = yaml.safe_load(compose_yaml(conf_dir=REPO / "conf"))
    data["train"]["sampels"] = 3
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="sampels"):
        load_params(p)


def test_stage_cli_exits_2_with_one_line_on_a_typo(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "eagle3_pipeline.stages.target",
            "--conf-dir",
            str(REPO / "conf"),
            "target.trian_steps=3",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "trian_steps" in proc.stderr
    assert not (tmp_path / "data").exists()


def test_compose_check_detects_stale_params(tmp_path):
    out = tmp_path / "params.yaml"
    cmd = [
        sys.executable,
        "-m",
        "eagle3_pipeline.tools.compose",
        "--conf-dir",
        str(REPO / "conf"),
        "--out",
        str(out),
    ]
    assert subprocess.run(cmd, capture_output=True, timeout=120).returncode == 0
    assert subprocess.run([*cmd, "--check"], capture_output=True, timeout=120).returncode == 0
    out.write_text(out.read_text().replace("samples: 240", "samples: 7"))
    assert subprocess.run([*cmd, "--check"], capture_output=True, timeout=120).returncode == 1


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("train.parallel=fdsp", "train.parallel"),
        ("train.scheduler=cosin", "train.scheduler"),
        ("train.draft.layer_type=mistral", "train.draft.layer_type"),
        ("train.dtype=fp8", "train.dtype"),
        ("train.device=tpu", "train.device"),
        ("train.attn_implementation=flash", "train.attn_implementation"),
        ("train.loss_implementation=triton", "train.loss_implementation"),
        ("validate.vllm_mode=http", "validate.vllm_mode"),
        ("validate.dtype=int8", "validate.dtype"),
        ("extract.backend=sglang", "extract.backend"),
        ("extract.on_mismatch=merge", "extract.on_mismatch"),
        ("data.regenerate_backend=openai", "data.regenerate_backend"),
        ("data.source=s3", "data.source"),
        ("hardware.train_dtype=fp8", "hardware.train_dtype"),
        ("model.dtype=fp16", "model.dtype"),
        # a typo'd key, and the test-only switches that are no settings
        ("train.sampels=5", "train.sampels"),
        ("validate.server.prot=1", "validate.server.prot"),
        ("extract.fail_after=1", "extract.fail_after"),
        ("train.fail_after_steps=1", "train.fail_after_steps"),
    ],
)
def test_bad_choice_or_key_fails_while_composing(override, key):
    """What `dvc exp run -S` composes: refused by the schema before any stage runs."""
    with pytest.raises(ConfigError) as err:
        compose([override], conf_dir=REPO / "conf")
    msg = str(err.value)
    assert key in msg and "\n" not in msg


def test_bad_choice_in_a_params_file_names_the_key(tmp_path):
    data = yaml.safe_load(compose_yaml(conf_dir=REPO / "conf"))
    data["train"]["parallel"] = "fdsp"
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"train\.parallel.*fdsp.*auto, ddp, fsdp"):
        load_params(p)


def test_choices_read_and_write_as_plain_strings():
    cfg = load_config(["model=kimi_k25", "hardware=rtx_pro_6000_x8"], conf_dir=REPO / "conf")
    assert cfg.hardware.device == "cuda" and cfg.extract.backend == "hf"
    assert f"{cfg.hardware.device}/{cfg.model.dtype}" == "cuda/bfloat16"
    assert str(cfg.train.parallel) == "auto" and {"auto": 1}[cfg.train.parallel] == 1
    text = json.dumps(asdict(cfg))
    assert '"device": "cuda"' in text and '"train_dtype": "bfloat16"' in text
    assert "Device" not in text and "Dtype" not in text
    assert "backend: hf" in compose_yaml(conf_dir=REPO / "conf")


def _leaves(node: dict, where: str = "") -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for key, value in node.items():
        here = f"{where}{key}"
        out += _leaves(value, f"{here}.") if isinstance(value, dict) else [(here, value)]
    return out


@pytest.mark.parametrize(
    "group_file",
    sorted(str(p.relative_to(REPO / "conf")) for p in (REPO / "conf").glob("*/*.yaml")),
)
def test_a_profile_gets_what_its_file_states_and_the_schema_the_rest(group_file):
    """Selecting a group's profile sets exactly the keys its file states (on top of the
    schema, the other groups staying as conf/config.yaml picks them): no key of the file is
    lost or overridden while composing, and nothing it does not state moves."""
    from omegaconf import OmegaConf

    group, name = group_file.removesuffix(".yaml").split("/")
    stated = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / group_file))
    # a data group without a file of its own needs data.path (sharegpt_file); one that
    # states its file keeps it
    needs_path = group == "data" and "path" not in stated and name != "builtin"
    extra = ["data.path=chats.jsonl"] if needs_path else []
    cfg = asdict(load_config([f"{group}={name}", *extra], conf_dir=REPO / "conf"))
    base = asdict(load_config(conf_dir=REPO / "conf"))
    for key, value in _leaves(stated):
        node = cfg[group]
        for part in key.split("."):
            node = node[part] if isinstance(node, dict) else None
        if isinstance(value, str) and "${" in value:
            continue  # an interpolation: resolved against the composed config
        assert node == value, f"{group_file}: {key} states {value!r}, composed {node!r}"
    for other in set(base) - {group, "paths"}:
        assert cfg[other] == base[other], (group_file, other)


def test_an_interpolated_default_follows_its_key():
    moved = load_config(["data.server.port=9000"], conf_dir=REPO / "conf")
    assert moved.data.server.base_url == "http://127.0.0.1:9000/v1"


def _restated(values: dict, defaults: dict, where: str) -> list[str]:
    """Leaves of ``values`` equal to the schema default at the same key."""
    found = []
    for key, value in values.items():
        here = f"{where}.{key}"
        default = defaults.get(key, object())
        if isinstance(value, dict) and isinstance(default, dict):
            found += _restated(value, default, here)
        elif value == default and isinstance(value, bool) == isinstance(default, bool):
            found.append(f"{here}: {value!r}")
    return found


def test_conf_states_no_schema_default():
    """Defaults live in the dataclasses only: conf/config.yaml picks the groups and a
    group file states only what its profile changes."""
    from omegaconf import OmegaConf

    top = yaml.safe_load((REPO / "conf" / "config.yaml").read_text(encoding="utf-8"))
    assert set(top) == {"defaults"}, f"conf/config.yaml sets {sorted(set(top) - {'defaults'})}"
    schema = OmegaConf.to_container(OmegaConf.structured(Config), enum_to_str=True)
    offenders = []
    for path in sorted((REPO / "conf").glob("*/*.yaml")):
        group = path.parent.name
        values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        offenders += [
            f"{path.relative_to(REPO)}: {leaf}" for leaf in _restated(values, schema[group], group)
        ]
    assert not offenders, "conf/ restates the schema's defaults:\n" + "\n".join(offenders)
