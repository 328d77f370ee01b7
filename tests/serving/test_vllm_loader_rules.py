"""Real vLLM (its CPU build) against the checkpoint validator's model of vLLM's EAGLE-3
loaders: every defect in tests/support/loader_rules.py that the validator refuses (quick
tier: tests/validate/test_checkpoint.py) makes vLLM refuse the draft too, with the message
the rule names; and an MLA draft trained for a target without a query low rank
(``model.tiny.q_lora_rank=null``) passes the validator and is served."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest
from loader_rules import RULES, LoaderRule, apply

from eagle3_pipeline.core.config import load_config
from eagle3_pipeline.serving.engine import build_engine
from eagle3_pipeline.serving.env import find_python
from eagle3_pipeline.serving.offline import VllmRunError, run_offline
from eagle3_pipeline.targets.adapter import TargetSpec, load_target_spec
from eagle3_pipeline.validate.checkpoint import validate_checkpoint

pytestmark = pytest.mark.slow


def _in(workdir: Path, fn, *args):
    old = os.getcwd()
    os.chdir(workdir)
    try:
        return fn(*args)
    finally:
        os.chdir(old)


def _spec(workdir: Path) -> TargetSpec:
    spec = load_target_spec(workdir / "data/target/target.json")
    return dataclasses.replace(spec, path=str(workdir / (spec.path or "")))


@pytest.fixture(scope="module")
def mla_workdir(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Kimi-K2.5 with an (untrained) MLA draft saved as the train stage saves it."""
    from workdirs import make_workdir

    return make_workdir(tiny_target, tmp_path_factory.mktemp("mla") / "w", layer_type="mla")


@pytest.mark.parametrize("rule", RULES, ids=[r.id for r in RULES])
def test_vllm_refuses_what_the_validator_refuses(
    rule: LoaderRule, mla_workdir: Path, validate_workdir: Path, tmp_path: Path
) -> None:
    workdir = mla_workdir if rule.layout == "mla" else validate_workdir
    spec = _spec(workdir)
    draft = tmp_path / "draft"
    shutil.copytree(workdir / "data/draft", draft)
    apply(rule, draft)
    report = validate_checkpoint(draft, spec, reload=False)
    assert [f for f in report.errors if f.code == rule.code and rule.where in f.where], (
        report.format()
    )

    cfg = _in(workdir, load_config, [])
    assert spec.path is not None
    engine = build_engine(cfg, spec, spec.path, "validate", dtype="float32", draft_dir=draft, k=3)
    log = tmp_path / "vllm.log"
    with pytest.raises(VllmRunError):
        run_offline(find_python(), engine, [[1, 2, 3]], 2, [], log, timeout_s=600)
    assert rule.vllm_says in log.read_text(errors="replace"), log.read_text()[-3000:]


def test_an_mla_draft_for_a_target_without_q_lora_is_validated_and_served(
    mla_workdir: Path, tmp_path: Path
) -> None:
    """The draft resolved for a target with ``q_lora_rank: null``, trained a few steps and
    saved as the train stage saves it: it has a query low rank of its own, the validator
    passes it and vLLM serves it (the one-q_proj form it replaces is refused above, rule
    mla-q-proj). The draft shares only the target's embeddings, lm_head and hidden
    states, so it is served with the tiny Kimi-K2.5 (the target stage cannot build a
    ``q_lora_rank: null`` tiny Kimi: transformers' kimi_k25 weight conversion turns its
    ``self_attn.q_proj`` into a vision ``wqkv`` on save and fails the reload)."""
    import torch
    from speculators.losses import resolve_loss_config

    from eagle3_pipeline.core.choices import DraftLayerType
    from eagle3_pipeline.core.config import DraftShapeConfig
    from eagle3_pipeline.draft.shape import build_draft, build_vocab_mapping, resolve_draft_shape
    from eagle3_pipeline.train.save import save_draft
    from eagle3_pipeline.validate.acceptance import load_prompts
    from eagle3_pipeline.validate.run import stop_token_ids

    spec = _spec(mla_workdir)
    assert spec.mla is not None and spec.path is not None
    no_q = dataclasses.replace(spec, mla=dataclasses.replace(spec.mla, q_lora_rank=None))
    options = DraftShapeConfig(layer_type=DraftLayerType.mla)
    shape = resolve_draft_shape(options, no_q)
    assert shape.mla is not None and shape.mla.q_lora_rank == 128  # min(kv 512, hidden 128)
    stops = stop_token_ids(spec.path)
    d2t, t2d = build_vocab_mapping(
        {i: 1 for i in range(spec.vocab_size)}, 1024, spec.vocab_size, stops
    )
    torch.manual_seed(0)
    model = build_draft(no_q, shape, 3, 1024, d2t, t2d, spec.path, "sdpa", options=options)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    n, h = 64, spec.hidden_size
    for _ in range(4):
        _, loss, _ = model(
            torch.randn(1, n, 3 * h),
            torch.randint(0, spec.vocab_size, (1, n)),
            torch.zeros(1, n, dtype=torch.long),
            loss_mask=torch.ones(1, n, dtype=torch.bool),
            verifier_last_hidden_states=torch.randn(1, n, h),
            ttt_steps=3,
            loss_config=resolve_loss_config("kl_div", "eager"),
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    draft = tmp_path / "draft"
    assert save_draft(model.eval(), draft, 3)["q_lora_rank"] == 128
    report = validate_checkpoint(draft, no_q, verifier_dir=spec.path)
    assert not report.errors, report.format()

    cfg = _in(mla_workdir, load_config, [])
    engine = build_engine(cfg, spec, spec.path, "validate", dtype="float32", draft_dir=draft, k=3)
    prompts = [p.prompt_ids for p in load_prompts(mla_workdir / "data/heldout/prompts.jsonl")]
    out = run_offline(find_python(), engine, prompts, 8, stops, tmp_path / "vllm.log")
    assert out.counters["drafts"] > 0
    assert len(out.outputs) == len(prompts)
