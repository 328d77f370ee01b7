"""The validate stage: vLLM command construction, the /metrics client against a real
localhost HTTP server, the report / model card, and the stage end to end on the tiny
Kimi-K2.5 target (pass, and refusal of a broken checkpoint)."""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import shlex
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from eagle3_pipeline.vllm_validate import (
    VllmError,
    parse_prometheus,
    scrape,
    serve_command,
    spec_decode_counters,
)

METRICS_BEFORE = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="target"} 10.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="target"} 30.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="target"} 12.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="0"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="2"} 1.0
vllm:num_requests_running{engine="0",model_name="target"} 0.0
"""

METRICS_AFTER = """\
vllm:spec_decode_num_drafts_total{engine="0",model_name="target"} 110.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="target"} 330.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="target"} 162.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="0"} 87.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="1"} 54.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="2"} 21.0
vllm:spec_decode_num_drafts_created 1.7e9
"""


# --------------------------------------------------------------------------- vLLM command


def test_serve_command_is_a_speculative_config_argv(tmp_path: Path) -> None:
    cmd = serve_command("moonshotai/Kimi-K2.5", tmp_path / "draft", 3, port=8011,
                        tensor_parallel_size=8, enable_expert_parallel=True,
                        max_model_len=4096, revision="abc123", trust_remote_code=True,
                        extra_args=["--enforce-eager"])
    assert cmd[:3] == ["vllm", "serve", "moonshotai/Kimi-K2.5"]
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": str((tmp_path / "draft").resolve()),
                    "num_speculative_tokens": 3}
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "8"
    assert cmd[cmd.index("--port") + 1] == "8011"
    assert cmd[cmd.index("--revision") + 1] == "abc123"
    for flag in ("--enable-expert-parallel", "--trust-remote-code", "--enforce-eager"):
        assert flag in cmd
    # survives a shell round trip (what the report prints)
    assert shlex.split(shlex.join(cmd)) == cmd
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        serve_command("t", tmp_path, 0, port=1)


# --------------------------------------------------------------------------- /metrics


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server on localhost serving canned Prometheus text (next in the list)."""
    pages = [METRICS_BEFORE, METRICS_AFTER]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = pages.pop(0).encode() if pages else b""
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", pages
    finally:
        server.shutdown()
        server.server_close()


def test_scrape_delta_gives_vllm_acceptance_length(metrics_server: tuple[str, list[str]]) -> None:
    url, _ = metrics_server
    before = scrape(url)
    after = scrape(url)
    fig = after.minus(before).figures()
    assert fig["num_drafts"] == 100 and fig["num_accepted_tokens"] == 150
    assert fig["mean_acceptance_length"] == pytest.approx(2.5)  # 1 + 150 / 100
    assert fig["num_accepted_tokens_per_pos"] == [80, 50, 20]
    assert fig["per_position_rate"] == pytest.approx([0.8, 0.5, 0.2])
    assert fig["draft_acceptance_rate"] == pytest.approx(0.5)


def test_metrics_parsing_sums_engines_and_refuses_missing_counters() -> None:
    two_engines = METRICS_BEFORE + METRICS_BEFORE.replace('engine="0"', 'engine="1"')
    c = spec_decode_counters(two_engines)
    assert (c.drafts, c.accepted, c.accepted_per_pos) == (20.0, 24.0, [14.0, 8.0, 2.0])
    samples = parse_prometheus('m{a="x,y",b="q\\"z"} 3\n')
    assert samples["m"] == [({"a": "x,y", "b": 'q"z'}, 3.0)]
    with pytest.raises(VllmError, match="spec_decode_num_drafts"):
        spec_decode_counters("vllm:num_requests_running 0\n")


# --------------------------------------------------------------------------- the stage


def make_workdir(tiny_target: Path, root: Path, n_prompts: int = 3) -> Path:
    """A copy of the tiny target's workdir with a draft saved as the train stage saves it
    and held-out prompts in the prepare stage's format."""
    from transformers import AutoTokenizer

    from eagle3_pipeline.config import DraftShapeConfig
    from eagle3_pipeline.corpus import builtin_conversations
    from eagle3_pipeline.data import render_ids
    from eagle3_pipeline.draft import build_draft, build_vocab_mapping, resolve_draft_shape
    from eagle3_pipeline.target import load_target_spec
    from eagle3_pipeline.training import save_draft
    from eagle3_pipeline.validation import stop_token_ids

    shutil.copytree(tiny_target / "conf", root / "conf")
    shutil.copytree(tiny_target / "data" / "target", root / "data" / "target")
    spec = load_target_spec(root / "data" / "target" / "target.json")
    model_dir = root / spec.path
    spec = dataclasses.replace(spec, path=str(model_dir))
    tok = AutoTokenizer.from_pretrained(model_dir)
    stops = stop_token_ids(model_dir)
    torch.manual_seed(0)
    d2t, t2d = build_vocab_mapping({i: 1 for i in range(spec.vocab_size)}, 1024,
                                   spec.vocab_size, stops)
    shape = resolve_draft_shape(DraftShapeConfig(), spec)
    model = build_draft(spec, shape, 3, 1024, d2t, t2d, model_dir, "sdpa")
    save_draft(model, root / "data" / "draft", 3)
    rows = []
    for i, c in enumerate(builtin_conversations(0)[:n_prompts]):
        msgs = c["messages"][:1]
        rows.append({"id": f"p{i}", "messages": msgs,
                     "prompt_ids": render_ids(tok, msgs, generation_prompt=True)})
    held = root / "data" / "heldout" / "prompts.jsonl"
    held.parent.mkdir(parents=True)
    held.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "metrics").mkdir()
    (root / "metrics" / "train.json").write_text(json.dumps(
        {"gpu": {"mode": "not applicable", "reason": "trained on CPU"}, "seed": 0,
         "draft_vocab_size": 1024, "train_rows": 10}))
    return root


@pytest.fixture(scope="module")
def workdir(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_workdir(tiny_target, tmp_path_factory.mktemp("validate"))


def _run_stage(root: Path, *overrides: str) -> None:
    from eagle3_pipeline.stages.validate import main

    old = os.getcwd()
    os.chdir(root)
    try:
        main(list(overrides))
    finally:
        os.chdir(old)


def test_stage_writes_metrics_report_plot_and_model_card(workdir: Path) -> None:
    _run_stage(workdir, "validate.max_new_tokens=8")
    m = json.loads((workdir / "metrics" / "validate.json").read_text())
    assert m["checkpoint_ok"] is True and m["checkpoint_errors"] == 0
    assert m["k"] == 3 and m["prompts"] == 3 and m["lossless"] is True
    assert 1.0 <= m["acceptance_length"] < 1.5  # an untrained draft
    assert len(m["per_position_rate"]) == 3 and m["verification_steps"] > 0
    assert m["gpu_after_train"]["mode"] == "not applicable" and m["gpu_released"] is None
    out = workdir / "data" / "validate"
    assert (out / "acceptance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert "tokens per target step** at K=3" in report and "not applicable" in report
    assert "--speculative-config" in report
    card = (out / "README.md").read_text()
    assert "PSF-2.0" in card and "K): 3" in card and "speculators:" in card
    assert "held-out prompts" in card and "Seed: 0" in card


def test_stage_fails_on_a_broken_checkpoint(workdir: Path, tmp_path: Path) -> None:
    root = tmp_path / "w"
    shutil.copytree(workdir, root, symlinks=True)
    cfg_path = root / "data" / "draft" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    del cfg["norm_before_residual"]
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(SystemExit) as exc:
        _run_stage(root, "validate.max_new_tokens=4")
    assert exc.value.code == 1
    assert not (root / "metrics" / "validate.json").exists()  # stale outputs removed
    assert not (root / "data" / "validate").exists()


def test_stage_refuses_bad_settings(workdir: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        _run_stage(workdir, "validate.k=0")
    assert exc.value.code == 1


FAKE_VLLM = '''
import json, sys, http.server
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
k = json.loads(args[args.index("--speculative-config") + 1])["num_speculative_tokens"]
state = {"drafts": 0, "accepted": 0}

class H(http.server.BaseHTTPRequestHandler):
    def _send(self, body, ctype="application/json"):
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self._send("")
        s = state
        text = "".join(f"vllm:spec_decode_num_{n}_total{{engine=\\"0\\"}} {v}\\n" for n, v in (
            ("drafts", s["drafts"]), ("draft_tokens", s["drafts"] * k),
            ("accepted_tokens", s["accepted"])))
        text += f"vllm:spec_decode_num_accepted_tokens_per_pos_total{{position=\\"0\\"}} {s['accepted']}\\n"
        self._send(text, "text/plain")

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = req["max_tokens"]
        state["drafts"] += n // 2
        state["accepted"] += n // 2
        self._send(json.dumps({"choices": [{"token_ids": list(range(n))}]}))

    def log_message(self, *a):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def test_vllm_client_against_a_fake_server_and_it_is_stopped(tmp_path: Path) -> None:
    """The whole client path on CPU: start, wait for /health, scrape, send the prompts,
    scrape, and the server process is gone afterwards."""
    import socket
    import sys

    from eagle3_pipeline.vllm_validate import run_vllm_validation

    fake = tmp_path / "fake_vllm.py"
    fake.write_text(FAKE_VLLM)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = serve_command("target", tmp_path / "draft", 3, port=port,
                        executable=(sys.executable, str(fake)))
    out = run_vllm_validation(cmd, port, [[1, 2, 3]] * 4, 8, tmp_path / "vllm.log",
                              concurrency=2, startup_timeout_s=60)
    assert out["num_drafts"] == 16 and out["num_accepted_tokens"] == 16
    assert out["mean_acceptance_length"] == 2.0
    assert out["generated_tokens"] == 32 and out["prompts"] == 4
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
