"""The one loader: conf/ + overrides and params.yaml give the same validated config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eagle3_pipeline.core.config import (
    Config,
    ConfigError,
    compose_yaml,
    load_config,
    load_params,
)

REPO = Path(__file__).resolve().parents[1]


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
    assert hw.interconnect == "pcie"
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
    ],
)
def test_bad_config_is_refused_naming_the_key(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_config(overrides, conf_dir=REPO / "conf")
    msg = str(err.value)
    assert needle in msg and "\n" not in msg


def test_params_file_with_unknown_key_is_refused(tmp_path):
    data = yaml.safe_load(compose_yaml(conf_dir=REPO / "conf"))
    data["train"]["sampels"] = 3
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="sampels"):
        load_params(p)


def test_stage_cli_exits_2_with_one_line_on_a_typo(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "eagle3_pipeline.stages.target", "--conf-dir",
         str(REPO / "conf"), "target.trian_steps=3"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "trian_steps" in proc.stderr
    assert not (tmp_path / "data").exists()


def test_compose_check_detects_stale_params(tmp_path):
    out = tmp_path / "params.yaml"
    cmd = [sys.executable, "-m", "eagle3_pipeline.core.compose", "--conf-dir", str(REPO / "conf"),
           "--out", str(out)]
    assert subprocess.run(cmd, capture_output=True, timeout=120).returncode == 0
    assert subprocess.run([*cmd, "--check"], capture_output=True, timeout=120).returncode == 0
    out.write_text(out.read_text().replace("samples: 240", "samples: 7"))
    assert subprocess.run([*cmd, "--check"], capture_output=True, timeout=120).returncode == 1
