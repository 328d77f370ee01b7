"""The real pretrained target through the whole DVC graph, reduced to fit CI.

SmolLM2-135M-Instruct (``model=smollm2_135m``): its GGUF file converted by the target
stage, a few conversations regenerated on-policy through a ``vllm serve`` the prepare
stage starts and stops, hidden states extracted, one epoch of training, and the draft
served in real vLLM beside the target. Asserted: behaviour, not quality (one epoch on a
handful of rows accepts little) -- vLLM loads the draft, its counters give our figure,
its output with the draft equals its output without, the speedup is the ratio of the two
measured rates, and what a real model brings (the template's system prompt, the
end-of-turn token, tied embeddings, 30 layers' aux ids) is handled as it must be.

The GGUF file comes from ``eagle3-fetch smollm2_135m`` (the README's test command runs
it). Without it the test is skipped, unless ``EAGLE3_REQUIRE_REAL_MODEL=1`` (CI sets it).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from commands import run_ok
from workdirs import repo_copy

REPO = Path(__file__).resolve().parents[2]
STAGES = ["preflight", "target", "prepare", "extract", "train", "validate"]
SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

pytestmark = pytest.mark.slow


def gguf_file() -> Path:
    from eagle3_pipeline.core.config import load_config

    g = load_config(["model=smollm2_135m"], conf_dir=REPO / "conf").model.gguf
    assert g is not None
    path = REPO / g.path
    if not path.is_file():
        if os.environ.get("EAGLE3_REQUIRE_REAL_MODEL") == "1":
            pytest.fail(f"{path} is missing: run `eagle3-fetch smollm2_135m`")
        pytest.skip(f"{path} is missing: run `eagle3-fetch smollm2_135m`")
    return path


def sharegpt_file() -> Path:
    """The fetched ShareGPT file (``eagle3-fetch sharegpt``), as gguf_file()."""
    from eagle3_pipeline.core.config import load_config

    path = REPO / str(load_config(["data=sharegpt"], conf_dir=REPO / "conf").data.path)
    if not path.is_file():
        if os.environ.get("EAGLE3_REQUIRE_REAL_MODEL") == "1":
            pytest.fail(f"{path} is missing: run `eagle3-fetch sharegpt`")
        pytest.skip(f"{path} is missing: run `eagle3-fetch sharegpt`")
    return path


# the reduced run: a few real ShareGPT conversations, short answers, one epoch, two
# prompts of each set (held-out ShareGPT, MT-Bench's two turns, HumanEval)
REDUCED = [
    "model=smollm2_135m",
    "data=sharegpt",
    "validate.prompt_sets=[heldout,mt_bench,humaneval]",
    "validate.num_prompts=2",
    "data.regenerate_backend=server",
    "data.server.start=true",
    "data.server.concurrency=8",
    "data.max_new_tokens=40",
    "data.heldout_size=4",
    "train.samples=10",
    "train.epochs=1",
    "train.draft_vocab_size=2048",
    "validate.max_new_tokens=24",
    # one greedy stream (the sampled pass and the concurrency sweep have their own tests)
    "validate.temperature=null",
    "validate.concurrency=[1]",
]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A repository copy that ran ``dvc repro`` on the reduced real-model config."""
    from pinned_files import link_benchmarks

    gguf = gguf_file()
    sharegpt = sharegpt_file()
    root = repo_copy(tmp_path_factory.mktemp("real"))
    link_benchmarks(root, "mt_bench", "humaneval")
    run_ok(
        root,
        sys.executable,
        "-m",
        "eagle3_pipeline.tools.compose",
        *REDUCED,
        f"model.gguf.path={gguf}",
        f"data.path={sharegpt}",
    )
    run_ok(root, "git", "add", "-A")
    run_ok(root, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "real")
    out = run_ok(root, sys.executable, "-m", "dvc", "repro").stdout
    return root, out


def _details(root: Path, stage: str) -> dict:
    return json.loads((root / "metrics/details" / f"{stage}.json").read_text())


def test_real_model_runs_the_graph_and_vllm_agrees_with_us(real_run):
    root, out = real_run
    for stage in STAGES:
        assert f"Running stage '{stage}'" in out, out[-3000:]
    v = _details(root, "validate")
    # vLLM loaded the draft and its spec-decode counters give our figure, per position too
    tol = yaml.safe_load((root / "params.yaml").read_text())["validate"]["vllm_agreement_tol"]
    assert v["checkpoint_errors"] == 0
    assert v["vllm"]["mean_acceptance_length"] == pytest.approx(
        v["ours"]["vllm_style_acceptance_length"], abs=tol
    )
    assert v["vllm"]["per_position_rate"] == pytest.approx(v["ours"]["per_position_rate"], abs=tol)
    assert v["vllm"]["lossless"] is True and v["lossless"] is True
    # the speedup is what the two measured rates give, each from its own vLLM engine
    assert v["vllm_speedup"] == pytest.approx(
        v["vllm"]["tokens_per_s_with_draft"] / v["vllm"]["tokens_per_s_without_draft"]
    )
    # two held-out conversations, two MT-Bench questions (two turns each), two problems
    assert v["ours"]["prompts"] == 8
    sets = v["sets"]
    assert [sets[s]["ours"]["prompts"] for s in ("heldout", "mt_bench", "humaneval")] == [2, 4, 2]
    for f in (sets[s] for s in sets):  # each set: vLLM's own counters give our figure
        assert f["vllm"]["mean_acceptance_length"] == pytest.approx(
            f["ours"]["vllm_style_acceptance_length"], abs=tol
        )
    assert len(sets["mt_bench"]["categories"]) == 2
    # real conversations: the seeded sample's content hash and the missing licence recorded
    p = _details(root, "prepare")
    assert p["conversations_train"] == 10
    # one precision, preflight's choice for this CPU, ran through every stage after it
    # (which one is tested per stated CPU in tests/runtime and tests/preflight); validate's
    # proof stays float32, its speed figures are measured in the chosen one
    chosen = _details(root, "preflight")["precision"]
    assert chosen["dtype"] in ("bfloat16", "float32")
    assert p["precision"] == chosen == _details(root, "target")["precision"]
    assert _details(root, "extract")["precision"] == chosen
    assert _details(root, "train")["dtype"] == chosen["dtype"]
    assert _details(root, "train")["dtype_why"] == chosen["why"]
    assert v["dtype"] == v["vllm"]["dtype"] == "float32"
    # the speed figures in the precision the run chose (bf16: a serving pair of their own)
    assert v["vllm"]["serving_dtype"] == chosen["dtype"]
    assert v["vllm"]["serving_dtype_why"] == chosen["why"]
    assert ("serving_with_draft" in v["vllm"]["commands"]) == (chosen["dtype"] != "float32")


def test_the_gguf_became_a_plain_tied_checkpoint(real_run):
    root, _ = real_run
    model = root / "data/target/model"
    source = json.loads((model / "gguf_source.json").read_text())
    assert (
        source["sha256"]
        == yaml.safe_load((root / "params.yaml").read_text())["model"]["gguf"]["sha256"]
    )
    assert source["max_logit_diff"] <= 1e-4 and source["versions"]["transformers"]
    config = json.loads((model / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    from safetensors import safe_open

    with safe_open(str(model / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    spec = json.loads((root / "data/target/target.json").read_text())
    # 30 layers: vLLM's default (2, L//2, L-3), the layers vLLM taps when serving the draft
    assert spec["num_layers"] == 30 and spec["aux_layer_ids"] == [2, 15, 27]
    draft = json.loads((root / "data/draft/config.json").read_text())
    assert draft["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]


def test_system_prompt_and_end_of_turn_as_the_target_serves_them(real_run):
    """Every row and held-out prompt carries the template's default system prompt, the
    prompts vLLM's chat endpoint rendered equal ours token for token, and a turn the
    target finished is supervised through its end-of-turn token."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    root, _ = real_run
    tok = AutoTokenizer.from_pretrained(root / "data/target/model")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    prep = _details(root, "prepare")
    regen = prep["regeneration"]
    # each regenerated turn's prompt came back from vLLM's chat endpoint: all equal ours
    assert regen["prompt_mismatch"] == 0 and prep["rows"] > 0
    ds = load_from_disk(str(root / "data/prepared"))
    opener = tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    for row in ds:
        ids, mask = row["input_ids"].tolist(), row["loss_mask"].tolist()
        assert tok.decode(ids[:30]).startswith(f"<|im_start|>system\n{SYSTEM_PROMPT}")
        first = mask.index(1)
        assert ids[first - 4 : first] == opener
        if im_end in ids[first:]:  # a finished turn: supervised through <|im_end|>
            end = ids.index(im_end, first)
            assert mask[end] == 1 and all(m == 0 for m in mask[end + 1 :])
    held = [json.loads(line) for line in (root / "data/heldout/prompts.jsonl").open()]
    for h in held:
        assert tok.decode(h["prompt_ids"]).startswith(f"<|im_start|>system\n{SYSTEM_PROMPT}")
        assert h["prompt_ids"][-4:] == opener
    # the stop token of serving is the end-of-turn token
    gen = json.loads((root / "data/target/model/generation_config.json").read_text())
    assert gen["eos_token_id"] == im_end
    # a recorded turn (short answers may all be cut at data.max_new_tokens): its row runs
    # through <|im_end|>, supervised, and stops there
    from eagle3_pipeline.data.conversation import Conversation, Message
    from eagle3_pipeline.data.rows import end_of_turn_ids, recorded_rows

    eot = end_of_turn_ids(tok, root / "data/target/model")
    assert eot == [im_end]
    conv = Conversation("c", (Message("user", "Say hi."), Message("assistant", "Hi!")))
    (row,), errors = recorded_rows(conv, tok, eot, "keep")
    assert not errors and row.completion[-1] == im_end
    assert tok.decode(row.completion) == "Hi!<|im_end|>"
