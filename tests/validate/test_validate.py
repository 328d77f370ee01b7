"""The validate stage: the /metrics parser against a real localhost HTTP server, the
report / model card, and the stage end to end on the tiny Kimi-K2.5 target in real vLLM
(its CPU build): pass, and refusal of a broken checkpoint."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from eagle3_pipeline.core.config import Config, ValidateConfig
from eagle3_pipeline.serving.counters import counter_delta
from eagle3_pipeline.serving.figures import acceptance_length, speedup, tokens_per_s
from eagle3_pipeline.validate.vllm import (
    _scrape,
    acceptance_figures,
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
    before = _scrape(url)
    after = _scrape(url)
    fig = acceptance_figures(counter_delta(after, before))
    assert fig.num_drafts == 100 and fig.num_accepted_tokens == 150
    assert fig.mean_acceptance_length == pytest.approx(2.5)  # 1 + 150 / 100
    assert fig.num_accepted_tokens_per_pos == [80, 50, 20]
    assert fig.per_position_rate == pytest.approx([0.8, 0.5, 0.2])


def test_metrics_parsing_sums_engines_and_sees_no_speculation() -> None:
    two_engines = METRICS_BEFORE + METRICS_BEFORE.replace('engine="0"', 'engine="1"')
    c = spec_decode_counters(two_engines)
    assert (c["drafts"], c["accepted"], c["accepted_per_pos"]) == (20, 24, [14, 8, 2])
    assert spec_decode_counters("vllm:num_requests_running 0\n") == {}
    assert acceptance_figures({}).mean_acceptance_length is None


# --------------------------------------------------------------------------- the stage


@pytest.fixture(scope="module")
def workdir(validate_workdir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("validate") / "w"
    shutil.copytree(validate_workdir, root, symlinks=True)
    return root


def _run_stage(root: Path, *overrides: str) -> None:
    from eagle3_pipeline.stages.validate import main

    old = os.getcwd()
    os.chdir(root)
    try:
        main(list(overrides))
    finally:
        os.chdir(old)


@pytest.mark.slow
def test_stage_writes_metrics_report_plot_and_model_card(workdir: Path) -> None:
    from record_samples import train_record

    # train's details (GPU release and all) are volatile readings that never feed validate:
    # a train.json that disagrees with the draft (another vocabulary) must change nothing
    train_record(draft_vocab_size=4096, gpu_released=False).write(
        workdir / "metrics" / "details" / "train.json"
    )
    _run_stage(workdir, "validate.max_new_tokens=8")
    m = json.loads((workdir / "metrics" / "details" / "validate.json").read_text())
    assert "checkpoint_ok" not in m and m["checkpoint_errors"] == 0
    assert m["k"] == 3 and m["ours"]["prompts"] == 3 and m["lossless"] is True
    # tokens per verification: every token but each prompt's first (the prefill's) came
    # from a verification step; an untrained draft adds next to nothing to the 1 per step
    assert m["acceptance_length"] == pytest.approx(
        (m["ours"]["tokens"] - m["ours"]["prompts"]) / m["ours"]["steps"]
    )
    assert m["acceptance_length"] < 1.5
    assert len(m["ours"]["per_position_rate"]) == 3 and m["ours"]["steps"] > 0
    # the same draft in real vLLM: its counters agree with our decoder, and it is lossless
    v = m["vllm"]
    assert v["num_drafts"] == m["ours"]["steps"]
    assert v["num_accepted_tokens_per_pos"] == m["ours"]["accepted_per_pos"]
    assert m["vllm"]["mean_acceptance_length"] == pytest.approx(
        m["ours"]["vllm_style_acceptance_length"]
    )
    assert m["vllm"]["lossless"] is True and v["lossless_prompts"] == 3
    assert (
        v["generated_tokens"] == m["ours"]["tokens"]
    )  # vLLM generated exactly our decoder's tokens
    # tokens/s is the generated tokens over the generation pass, never over the engine's load
    for run in ("with_draft", "without_draft"):
        assert v[f"tokens_per_s_{run}"] == pytest.approx(
            tokens_per_s(v["generated_tokens"], v["wall_s"][run])
        )
        assert v["wall_s"][run] > 0
    # the speedup is the ratio of the two passes' tokens/s over the same prompts
    assert m["vllm_speedup"] == pytest.approx(
        speedup(v["tokens_per_s_with_draft"], v["tokens_per_s_without_draft"])
    )
    assert v["workarounds"]["with_draft"]["env"].get("VLLM_MLA_DISABLE") == "1"
    assert "VLLM_MLA_DISABLE" not in v["workarounds"]["without_draft"]["env"]
    # the CPU build's sampling patch (compat.vllm_expand) reached both engines
    assert v["workarounds"]["with_draft"]["patches"] == ["cpu_expand_kernel"]
    assert v["workarounds"]["without_draft"]["patches"] == ["cpu_expand_kernel"]
    out = workdir / "data" / "validate"
    assert (out / "acceptance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert "tokens per target step** at K=3" in report
    assert "--speculative-config" in report and "## In vLLM" in report
    assert "--dtype float32" in report
    # dvclive: the headline DVC shows is the stage's own figures; per-position acceptance
    live = workdir / "dvclive" / "validate"
    assert json.loads((live / "metrics.json").read_text()) == {
        "acceptance_length": m["acceptance_length"],
        "vllm_speedup": m["vllm_speedup"],
        "lossless": True,
    }
    # the held-out set alone: the serving figures stay in the details (the table's width)
    assert "acceptance_by_set_sampled" not in m and "vllm_speedup_by_concurrency" not in m
    sampled = m["vllm"]["sampled"]
    assert sampled["temperature"] == ValidateConfig().temperature and sampled["num_drafts"] > 0
    # 3 prompts: levels 4 and 16 skipped, 1 is the single stream above
    assert m["vllm"]["concurrency"]["skipped"] == [4, 16]
    assert [r["concurrency"] for r in m["vllm"]["concurrency"]["levels"]] == [1]
    points = json.loads((live / "plots/custom/acceptance_per_position.json").read_text())
    assert [p["acceptance"] for p in points] == m["ours"]["per_position_rate"]
    assert (live / "plots/images/acceptance.png").read_bytes()[:4] == b"\x89PNG"
    card = (out / "README.md").read_text()
    assert "PSF-2.0" in card and "K): 3" in card and "speculators:" in card
    assert "- Draft vocabulary: 1024" in card  # the draft's config.json, not train.json
    assert "prompts never trained on" in card and "- heldout (3 prompts): " in card
    assert "Seed: 0" in card
    # the held-out set alone: no per-set headline (the figures above are that set's)
    assert "acceptance_by_set" not in m and m["sets"]["heldout"]["ours"]["prompts"] == 3


@pytest.mark.slow
def test_every_prompt_set_gets_vllms_own_figures_equal_to_ours(
    workdir: Path, tmp_path: Path
) -> None:
    """held-out, MT-Bench (both turns, the second after the target's own answer) and
    HumanEval in one validation: each set's, turn's and category's acceptance from vLLM's
    counters read per prompt equals our decoder's on the same prompts."""
    from pinned_files import link_benchmarks

    root = tmp_path / "w"
    shutil.copytree(workdir, root, symlinks=True)
    link_benchmarks(root, "mt_bench", "humaneval")
    _run_stage(
        root,
        "validate.max_new_tokens=8",
        "validate.prompt_sets=[heldout,mt_bench,humaneval]",
        "validate.num_prompts=2",
    )
    m = json.loads((root / "metrics" / "details" / "validate.json").read_text())
    assert m["prompt_sets"] == ["heldout", "mt_bench", "humaneval"]
    sets = m["sets"]
    # 2 held-out + 2 MT-Bench questions x 2 turns + 2 HumanEval problems, pooled above
    assert [sets[s]["ours"]["prompts"] for s in m["prompt_sets"]] == [2, 4, 2]
    assert m["ours"]["prompts"] == 8 and m["vllm"]["prompts"] == 8
    assert sets["mt_bench"]["questions"] == 2
    assert sorted(sets["mt_bench"]["turns"]) == ["1", "2"]
    assert len(sets["mt_bench"]["categories"]) == 2  # stratified: two categories
    slices = [sets[s] for s in m["prompt_sets"]]
    slices += list(sets["mt_bench"]["turns"].values())
    slices += list(sets["mt_bench"]["categories"].values())
    for f in slices:  # vLLM's counters per slice agree with our decoder's, exactly
        assert f["vllm"]["num_drafts"] == f["ours"]["steps"]
        assert f["vllm"]["num_accepted_tokens_per_pos"] == f["ours"]["accepted_per_pos"]
        assert f["vllm"]["mean_acceptance_length"] == pytest.approx(
            f["ours"]["vllm_style_acceptance_length"]
        )
    # the slices add up to the whole run's counters
    assert sum(sets[s]["vllm"]["num_drafts"] for s in sets) == m["vllm"]["num_drafts"]
    assert m["acceptance_by_set"] == {
        s: sets[s]["vllm"]["mean_acceptance_length"] for s in m["prompt_sets"]
    }
    live = json.loads((root / "dvclive/validate/metrics.json").read_text())
    assert live["acceptance_by_set"] == m["acceptance_by_set"]
    out = root / "data" / "validate"
    report = (out / "report.md").read_text()
    assert "## Acceptance length per prompt set" in report
    assert "| mt_bench, turn 2 | 2 |" in report and "mt_bench per category" in report
    assert "K=3, temperature 0" in report and "concurrency 1" in report
    assert (out / "acceptance_by_set.png").read_bytes()[:4] == b"\x89PNG"
    # the sampled pass (validate.temperature's default), per set from vLLM's counters
    sampled = m["vllm"]["sampled"]
    assert (sampled["temperature"], sampled["seed"]) == (
        ValidateConfig().temperature,
        Config().seed,
    )
    assert list(sampled["sets"]) == m["prompt_sets"]
    assert sum(f["num_drafts"] for f in sampled["sets"].values()) == sampled["num_drafts"] > 0
    for f in [sampled, *sampled["sets"].values()]:
        assert f["mean_acceptance_length"] == pytest.approx(
            acceptance_length(f["num_accepted_tokens"], f["num_drafts"])
        )
    assert m["acceptance_by_set_sampled"] == {
        s: f["mean_acceptance_length"] for s, f in sampled["sets"].items()
    }
    assert live["acceptance_by_set_sampled"] == m["acceptance_by_set_sampled"]
    # the default levels 1, 4, 16: 8 prompts decoded, so 16 is skipped, not mislabelled
    conc = m["vllm"]["concurrency"]
    assert [r["concurrency"] for r in conc["levels"]] == [1, 4] and conc["skipped"] == [16]
    one, four = conc["levels"]
    assert one["speedup"] == pytest.approx(m["vllm_speedup"])
    # the draft ran at 4 in flight (this untrained draft accepts next to nothing)
    # vLLM counted drafts in that pass (no drafts: no acceptance length)
    assert four["generated_tokens"] > 0 and four["acceptance_length"] is not None
    assert m["vllm_speedup_by_concurrency"] == {"1": one["speedup"], "4": four["speedup"]}
    losing = [r["concurrency"] for r in conc["levels"] if r["speedup"] < 1]
    assert m["vllm_break_even_concurrency"] == (min(losing) if losing else None)
    assert "## Sampled (temperature > 0)" in report and "## Under load" in report
    assert "Not measured: [16]" in report
    assert (out / "speedup_by_concurrency.png").read_bytes()[:4] == b"\x89PNG"


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
    assert not (root / "metrics" / "details" / "validate.json").exists()  # stale outputs removed
    assert not (root / "data" / "validate").exists()


def test_stage_refuses_bad_settings(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _run_stage(workdir, "validate.k=0")
    assert exc.value.code == 2  # a config error: refused when composed, before any work
    # one line on stderr that names the stage and the offending key
    err = capsys.readouterr().err.splitlines()
    assert "error: validate: validate.k=0 must be >= 1 (or null)" in err, err


@pytest.mark.slow
def test_an_mla_draft_is_served_by_vllm_with_the_tiny_kimi(
    tiny_target: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """train.draft.layer_type=mla: vLLM's CPU build serves the MLA draft (deepseek_eagle3)
    with MLA on for the target too (both CPU_MLA, block size 16); its counters equal our
    evaluator's and it is lossless."""
    from workdirs import make_workdir

    root = make_workdir(tiny_target, tmp_path_factory.mktemp("mla") / "w", layer_type="mla")
    _run_stage(
        root,
        "train.draft.layer_type=mla",
        "validate.max_new_tokens=8",
        # one greedy stream: the sampled pass and the sweep do not depend on the layer type
        "validate.temperature=null",
        "validate.concurrency=[1]",
    )
    m = json.loads((root / "metrics" / "details" / "validate.json").read_text())
    assert m["checkpoint_errors"] == 0, m.get("checkpoint_findings")
    v = m["vllm"]
    assert v["num_drafts"] == m["ours"]["steps"] > 0
    assert v["num_accepted_tokens_per_pos"] == m["ours"]["accepted_per_pos"]
    assert m["vllm"]["lossless"] is True and m["lossless"] is True
    env = v["workarounds"]["with_draft"]["env"]
    assert "VLLM_MLA_DISABLE" not in env  # an MLA draft keeps the target's MLA on
