"""The tiny Kimi-K2.5 target, its held-out prompts and a briefly trained draft: the setup
the evaluator's tests (tests/validate/test_acceptance.py) and the real-vLLM tests that
compare vLLM's counters with our evaluator's share."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from eagle3_pipeline.validate.acceptance import Prompt, Target

K = 3
MAX_NEW = 24
N_PROMPTS = 4


@dataclasses.dataclass
class Setup:
    spec: Any
    target: Target
    prompts: list[Prompt]
    train_seqs: list[list[int]]
    stops: list[int]


def make_setup(workdir: Path) -> Setup:
    from transformers import AutoTokenizer

    from eagle3_pipeline.core.corpus import builtin_conversations
    from eagle3_pipeline.targets.adapter import load_target_spec
    from eagle3_pipeline.targets.chat import render_ids
    from eagle3_pipeline.validate.run import stop_token_ids

    spec = load_target_spec(workdir / "data" / "target" / "target.json")
    model_dir = workdir / (spec.path or "")
    spec = dataclasses.replace(spec, path=str(model_dir))
    tok = AutoTokenizer.from_pretrained(model_dir)
    convs = builtin_conversations(0)
    prompts = [
        Prompt(str(i), render_ids(tok, c["messages"][:1], generation_prompt=True))
        for i, c in enumerate(convs[:N_PROMPTS])
    ]
    train = [
        render_ids(tok, c["messages"][:2], generation_prompt=False)[:256]
        for c in convs[N_PROMPTS : N_PROMPTS + 60]
    ]
    return Setup(spec, Target.load(spec), prompts, train, stop_token_ids(model_dir))


def new_draft(s: Setup, seed: int = 0, **options: Any) -> Any:
    from eagle3_pipeline.core.config import DraftShapeConfig
    from eagle3_pipeline.draft.shape import build_draft, build_vocab_mapping, resolve_draft_shape

    torch.manual_seed(seed)
    freq = Counter(t for seq in s.train_seqs for t in seq)
    d2t, t2d = build_vocab_mapping(dict(freq), 1024, s.spec.vocab_size, s.stops)
    draft_cfg = DraftShapeConfig(**options)
    shape = resolve_draft_shape(draft_cfg, s.spec)
    return build_draft(s.spec, shape, K, 1024, d2t, t2d, s.spec.path, "sdpa", options=draft_cfg)


def train_draft(setup: Setup, steps: int, **options: Any) -> Any:
    """A draft trained for ``steps`` steps with speculators' own forward + loss on the target's
    hidden states of corpus conversations (the extract stage's layout, shifted as
    ``shift_batch`` does); ``options``: ``train.draft`` settings (``layer_type="mla"``)."""
    from speculators.losses import resolve_loss_config

    model = new_draft(setup, **options)
    samples = []
    for seq in setup.train_seqs:
        _, st = setup.target.states(seq)
        samples.append((st[:-1, :-1].flatten(1), torch.tensor(seq[1:]), st[1:, -1]))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    loss_config = resolve_loss_config("kl_div", "eager")
    rng = random.Random(0)
    for _ in range(steps):
        h, ids, last = samples[rng.randrange(len(samples))]
        n = ids.shape[0]
        _, loss, _ = model(
            hidden_states=h[None],
            input_ids=ids[None],
            document_ids=torch.zeros(1, n, dtype=torch.long),
            loss_mask=torch.ones(1, n, dtype=torch.long),
            position_ids=torch.arange(1, n + 1)[None],
            verifier_last_hidden_states=last[None],
            ttt_steps=K,
            loss_config=loss_config,
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()
