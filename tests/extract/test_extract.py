"""The `extract` stage: hidden states in speculators' format, read back by speculators."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from extract_work import config, extract, make_rows, rows_of, workdir_for
from safetensors.torch import load_file

from eagle3_pipeline.extract import vllm_backend as V
from eagle3_pipeline.extract.batch_plan import plan_batches, rank_batches
from eagle3_pipeline.extract.layout import TMP_GLOB
from eagle3_pipeline.extract.rows import load_rows
from eagle3_pipeline.extract.writer import save_hidden_states
from eagle3_pipeline.runtime.faults import FAULT_EXIT_CODE
from eagle3_pipeline.serving.server import VllmServer
from eagle3_pipeline.stages.runner import StageError
from eagle3_pipeline.targets.adapter import load_target_spec
from eagle3_pipeline.targets.loading import load_language_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kimi_run(tiny_target, tmp_path_factory):
    """One uninterrupted fp32 extraction over 8 rows of the tiny Kimi-K2.5."""
    wd = workdir_for(tiny_target, tmp_path_factory.mktemp("kimi_extract"))
    metrics = extract(wd, "extract.dtype=float32")
    return wd, metrics


# --------------------------------------------------------------------------- plan


def test_batch_plan_is_padding_aware_deterministic_and_prefix_stable():
    lengths = [5, 30, 7, 30, 12, 3, 9, 40, 2, 8]
    plan = plan_batches(lengths, batch_tokens=60, plan_rows=4)
    assert sorted(i for b in plan for i in b) == list(range(len(lengths)))
    for b in plan:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 60
        assert all(lengths[a] >= lengths[c] for a, c in zip(b, b[1:], strict=False))
    assert plan == plan_batches(lengths, 60, 4)
    grown = plan_batches(lengths + [11, 1, 50], 60, 4)
    # the full segments of the first rows keep their batches when rows are appended
    assert [b for b in plan if max(b) < 8] == [b for b in grown if max(b) < 8]
    assert rank_batches(plan, 1, 2) == [(j, b) for j, b in enumerate(plan) if j % 2 == 1]


# --------------------------------------------------------------------------- content


def _reference(model_dir: Path, ids: list[int]):
    from eagle3_pipeline.targets.tiny import load_target_model

    model = load_target_model(model_dir)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return model, out


def _lm_parts(model):
    """(final norm, lm_head) of the full model, whatever the nesting."""
    lm = getattr(model.model, "language_model", model.model)
    return lm.norm, model.lm_head


def _check_files_against_full_model(wd: Path, spec) -> None:
    model_dir = wd / spec.path
    rows = rows_of(wd)
    for i in (0, 4 if len(rows) > 4 else 3):  # the longest and a right-padded row
        f = load_file(wd / f"data/hidden_states/hs_{i}.safetensors")
        assert f["token_ids"].dtype == torch.int64 and f["token_ids"].tolist() == rows[i]
        hs = f["hidden_states"]
        assert hs.shape == (len(rows[i]), len(spec.aux_layer_ids) + 1, spec.hidden_size)
        model, out = _reference(model_dir, rows[i])
        for pos, k in enumerate(spec.aux_layer_ids):  # aux k = residual entering layer k
            torch.testing.assert_close(hs[:, pos], out.hidden_states[k][0], rtol=1e-4, atol=1e-4)
        norm, lm_head = _lm_parts(model)
        with torch.no_grad():
            logits = lm_head(norm(hs[:, -1]))
        torch.testing.assert_close(logits, out.logits[0], rtol=1e-4, atol=1e-4)
        # and it is not the post-norm state transformers reports last
        assert not torch.allclose(hs[:, -1], out.hidden_states[-1][0], atol=1e-3)


def test_kimi_aux_states_and_final_state_reproduce_the_target(kimi_run):
    wd, metrics = kimi_run
    spec = load_target_spec(wd / "data/target/target.json")
    assert spec.nested and metrics.samples_written == 8 and metrics.batches_skipped == 0
    assert (metrics.device, metrics.model_dtype) == ("cpu", "float32")  # read off the model
    _check_files_against_full_model(wd, spec)
    manifest = json.loads((wd / "data/hidden_states/manifest.json").read_text())
    assert manifest["layers"]["aux_layer_ids"] == spec.aux_layer_ids
    assert manifest["samples"]["count"] == 8 and manifest["dtype"] == "float32"
    for key in (
        "samples",
        "tokens",
        "tokens_per_s",
        "wall_s",
        "bytes_written",
        "bytes_per_token",
        "peak_rss_bytes",
        "backend",
        "aux_layer_ids",
        "hardware",
    ):
        assert key in metrics.to_dict()


def test_llama_aux_states_and_final_state_reproduce_the_target(tiny_llama_target, tmp_path):
    wd = workdir_for(tiny_llama_target, tmp_path, n=4)
    extract(wd, "extract.dtype=float32", model="tiny_llama")
    spec = load_target_spec(wd / "data/target/target.json")
    assert not spec.nested
    _check_files_against_full_model(wd, spec)


def test_language_model_only_no_vision_tower(tiny_target):
    spec = load_target_spec(tiny_target / "data/target/target.json")
    lm = load_language_model(spec, tiny_target / spec.path, "float32")
    names = [n for n, _ in lm.model.named_parameters()]
    assert names and not any("vision" in n or "mm_projector" in n for n in names)


def test_speculators_loader_reads_every_file(kimi_run):
    from hs_connectors import FileTransfer
    from speculators.train.data import ArrowDataset, CollateFn
    from speculators.train.recovery import SampleUnavailable

    wd, _ = kimi_run
    ds = ArrowDataset(
        max_len=512,
        datapath=str(wd / "data/prepared"),
        transfer=FileTransfer(wd / "data/hidden_states"),
        on_missing="raise",
        hidden_states_dtype=torch.float32,
    )
    spec = load_target_spec(wd / "data/target/target.json")
    collate = CollateFn(512, spec.hidden_size, len(spec.aux_layer_ids), dtype=torch.float32)
    read = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a dropped (mismatched) sample only warns
        for i in range(len(ds)):
            item = ds[i]
            assert not isinstance(item, SampleUnavailable), item
            assert item["hidden_states"].shape[1] == len(spec.aux_layer_ids) * spec.hidden_size
            batch = collate([item])
            assert batch["error_records"] == 0
            read += 1
    assert read == len(rows_of(wd)) == 8


# --------------------------------------------------------------------------- resume


def test_fault_kills_mid_run_and_the_rerun_matches_an_uninterrupted_run(
    kimi_run, tiny_target, tmp_path
):
    ref, ref_metrics = kimi_run
    wd = workdir_for(tiny_target, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "EAGLE3_FAULT_EXTRACT_FAIL_AFTER": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "eagle3_pipeline.stages.extract",
            "--conf-dir",
            str(REPO / "conf"),
            "extract.batch_tokens=96",
            "extract.fsync=false",
            "extract.dtype=float32",
        ],
        cwd=wd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == FAULT_EXIT_CODE, proc.stderr[-2000:]
    out = wd / "data/hidden_states"
    plan = plan_batches([len(r) for r in rows_of(wd)], 96, 256)
    assert len(plan) >= 3
    first = {i: (out / f"hs_{i}.safetensors").stat().st_ino for i in plan[0]}
    assert list(out.glob(TMP_GLOB)), "the fault leaves a file cut mid-write"
    assert len(list(out.glob("hs_*.safetensors"))) < 8
    metrics = extract(wd, "extract.dtype=float32")
    assert metrics.batches_skipped == 1
    assert metrics.batches_computed == ref_metrics.batches_computed - 1
    assert {i: (out / f"hs_{i}.safetensors").stat().st_ino for i in plan[0]} == first
    assert not list(out.glob(TMP_GLOB))
    for i in range(8):
        name = f"hs_{i}.safetensors"
        assert (out / name).read_bytes() == (ref / "data/hidden_states" / name).read_bytes()
    assert (out / "manifest.json").read_bytes() == (
        ref / "data/hidden_states/manifest.json"
    ).read_bytes()
    again = extract(wd, "extract.dtype=float32")
    assert again.batches_computed == 0 and again.samples_written == 0


def test_growing_and_shrinking_the_rows_extracts_only_new_rows(tiny_target, tmp_path):
    wd = workdir_for(tiny_target, tmp_path, n=4)
    assert extract(wd).samples_written == 4
    out = wd / "data/hidden_states"
    inodes = {i: (out / f"hs_{i}.safetensors").stat().st_ino for i in range(4)}
    make_rows(wd, 7)  # rows 0..3 unchanged, 3 appended
    grown = extract(wd)
    assert grown.samples_written == 3 and grown.samples_reused == 4
    assert {i: (out / f"hs_{i}.safetensors").stat().st_ino for i in range(4)} == inodes
    make_rows(wd, 4)  # back to 4: everything reused
    assert extract(wd).samples_written == 0
    make_rows(wd, 5, offset=10)  # other rows: refused, never mixed
    with pytest.raises(StageError, match="never mixed"):
        extract(wd, "extract.on_mismatch=refuse")
    with pytest.raises(StageError, match="dtype"):
        make_rows(wd, 4)
        extract(wd, "extract.dtype=float32", "extract.on_mismatch=refuse")
    restarted = extract(wd, "extract.dtype=float32", "extract.on_mismatch=restart")
    assert restarted.samples_written == 4


def test_rank_split_covers_every_row_once(tiny_target, tmp_path):
    wd = workdir_for(tiny_target, tmp_path, n=6)
    a = extract(wd, "extract.world_size=2", "extract.rank=0")
    b = extract(wd, "extract.world_size=2", "extract.rank=1")
    assert a.samples_written + b.samples_written == 6
    assert a.batches_rank + b.batches_rank == a.batches_total
    assert sorted(p.name for p in (wd / "data/hidden_states").glob("hs_*")) == sorted(
        f"hs_{i}.safetensors" for i in range(6)
    )


# --------------------------------------------------------------------------- bad input


def _nothing_written(wd: Path) -> bool:
    out = wd / "data/hidden_states"
    return not out.exists() or not any(out.iterdir())


def test_layer_ids_out_of_range_are_refused(tiny_target, tmp_path):
    wd = tmp_path
    (wd / "data/target").mkdir(parents=True)
    (wd / "data/target/model").symlink_to(tiny_target / "data/target/model")
    spec = json.loads((tiny_target / "data/target/target.json").read_text())
    spec["aux_layer_ids"] = [1, 9]
    (wd / "data/target/target.json").write_text(json.dumps(spec))
    make_rows(wd, 2)
    with pytest.raises(StageError, match=r"aux_layer_ids=\[1, 9\].*4-layer"):
        extract(wd)
    assert _nothing_written(wd)


def test_rows_from_another_tokenizer_are_refused(tiny_target, tmp_path):
    from datasets import Dataset

    wd = workdir_for(tiny_target, tmp_path, n=2)
    import shutil

    shutil.rmtree(wd / "data/prepared")
    Dataset.from_dict(
        {"input_ids": [[1, 2, 3], [5, 99999]], "loss_mask": [[1] * 3, [1] * 2], "seq_len": [3, 2]}
    ).save_to_disk(str(wd / "data/prepared"))
    with pytest.raises(StageError, match="row 1: token id 99999 outside"):
        extract(wd)
    assert _nothing_written(wd)
    make_rows(wd, 2)
    (wd / "data/prepared/prepare.json").write_text(json.dumps({"tokenizer_sha256": "0" * 64}))
    with pytest.raises(StageError, match="another tokenizer"):
        extract(wd)
    assert _nothing_written(wd)


def test_unwritable_output_and_full_disk_are_refused(tiny_target, tmp_path, monkeypatch):
    wd = workdir_for(tiny_target, tmp_path, n=2)
    (wd / "data/hidden_states").write_text("not a directory")
    with pytest.raises(StageError, match="not writable"):
        extract(wd)
    (wd / "data/hidden_states").unlink()
    import shutil

    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    with pytest.raises(StageError, match="GB free"):
        extract(wd)
    assert _nothing_written(wd)


def test_a_target_that_cannot_be_loaded_is_refused(tiny_target, tmp_path):
    import shutil

    wd = tmp_path
    shutil.copytree(tiny_target / "data/target", wd / "data/target")
    shard = sorted((wd / "data/target/model").glob("model-*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    make_rows(wd, 2)
    with pytest.raises(StageError, match="cannot be loaded"):
        extract(wd)
    assert _nothing_written(wd)


def test_stage_entrypoint_reports_bad_input_in_one_line(tiny_target, tmp_path, capsys):
    from eagle3_pipeline.stages.extract import main

    wd = tmp_path
    (wd / "data").mkdir()
    (wd / "data/target").symlink_to(tiny_target / "data/target")
    old = os.getcwd()
    os.chdir(wd)
    try:
        with pytest.raises(SystemExit) as exc:
            main(["--conf-dir", str(REPO / "conf")])
    finally:
        os.chdir(old)
    assert exc.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: extract:") and "prepared dataset not found" in err


# --------------------------------------------------------------------------- vllm


def test_vllm_client_command(tiny_target):
    spec = load_target_spec(tiny_target / "data/target/target.json")
    cfg = config(tiny_target, "hardware=rtx_pro_6000_x8", "extract.backend=vllm")
    client = V.client_command(cfg, spec, Path("/d/prepared"), Path("/d/hs"))
    # speculators' client, run through the shim that makes it send the server's API key
    assert client[1:4] == ["-m", "eagle3_pipeline.compat.offline_client", "generate-offline-data"]
    for flag, value in (
        ("--preprocessed-data", "/d/prepared"),
        ("--output", "/d/hs"),
        ("--model", spec.name),
        ("--rank", "0"),
        ("--world-size", "1"),
    ):
        assert client[client.index(flag) + 1] == value
    assert "--fail-on-error" in client and "--validate-outputs" in client
    assert V._rank_rows(10, 0, 3) == [0, 1, 2, 3] and V._rank_rows(10, 2, 3) == [7, 8, 9]


FAKE_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_is_shut_down_on_error_and_ctrl_c(tmp_path):
    for exc in (RuntimeError("boom"), KeyboardInterrupt()):
        port = _free_port()
        server = VllmServer(
            [sys.executable, "-c", FAKE_SERVER, str(port)],
            port,
            tmp_path / "server.log",
            startup_timeout_s=60,
            shutdown_timeout_s=5,
            timeout_key="extract.vllm.startup_timeout_s",
        )
        with pytest.raises(type(exc)):
            with server:
                proc = server.proc
                assert proc is not None and proc.poll() is None
                raise exc
        assert proc.poll() is not None and server.proc is None
    dead = VllmServer(
        [sys.executable, "-c", "import sys; print('no gpu'); sys.exit(3)"],
        _free_port(),
        tmp_path / "dead.log",
        60,
        5,
        timeout_key="extract.vllm.startup_timeout_s",
    )
    with pytest.raises(StageError, match=r"exited with 3.*: no gpu \(log .*dead.log\)"):
        with dead:
            pass


def test_vllm_files_are_validated_and_converted(kimi_run, tmp_path):
    wd, _ = kimi_run
    spec = load_target_spec(wd / "data/target/target.json")
    rows = load_rows(wd / "data/prepared", spec.vocab_size)
    out = tmp_path / "hs"
    out.mkdir()
    n_layers = len(spec.aux_layer_ids) + 1
    for i in range(2):  # what vLLM's connector writes: model dtype, [seq, n_layers, hidden]
        ids = torch.tensor(rows_of(wd)[i])
        hs = torch.randn(len(ids), n_layers, spec.hidden_size, dtype=torch.bfloat16)
        save_hidden_states(out / f"hs_{i}.safetensors", ids, hs, fsync=False)
    assert V.validate_and_convert(rows, out, [0, 1], n_layers, spec.hidden_size, "float32") == 2
    assert load_file(out / "hs_0.safetensors")["hidden_states"].dtype == torch.float32
    bad = torch.tensor(rows_of(wd)[1])
    bad[0] += 1
    save_hidden_states(
        out / "hs_1.safetensors",
        bad,
        torch.zeros(len(bad), n_layers, spec.hidden_size),
        fsync=False,
    )
    with pytest.raises(StageError, match="hs_1.safetensors: token_ids differ"):
        V.validate_and_convert(rows, out, [0, 1], n_layers, spec.hidden_size, "float32")
    assert not (out / "hs_1.safetensors").exists()
