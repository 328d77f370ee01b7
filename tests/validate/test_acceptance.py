"""Chained greedy speculative decoding against the tiny Kimi-K2.5 target.

What is proven here: the decoding is lossless (identical to the target's plain greedy
decoding, fp32 on CPU); an oracle draft scores K+1, a draft right only at its first
position scores 2, an untrained draft about 1, and a briefly trained draft strictly more;
and the draft's inference path reproduces speculators' own ``Eagle3DraftModel.forward``
(its TTT unroll) token for token, so the figures measure the draft vLLM would serve.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from acceptance_setup import MAX_NEW, N_PROMPTS, K, Setup, make_setup, new_draft, train_draft

from eagle3_pipeline.core.config import ConfigError
from eagle3_pipeline.validate.acceptance import (
    CachedTarget,
    OracleDraft,
    Prompt,
    SpeculatorsDraft,
    Target,
    decode_check,
    greedy_check,
    greedy_decode,
    load_prompts,
    measure,
    speculative_decode,
)


@pytest.fixture(scope="module")
def setup(tiny_target: Path, single_thread: None) -> Iterator[Setup]:
    s = make_setup(tiny_target)
    yield s
    s.target.close()


@pytest.fixture(scope="module")
def untrained(setup: Setup) -> Any:
    return new_draft(setup)


@pytest.fixture(scope="module")
def trained(setup: Setup) -> Any:
    return train_draft(setup, 120)


def run(s: Setup, draft: Any) -> Any:
    result, _ = measure(s.target, draft, s.prompts, K, MAX_NEW, s.stops)
    return result


class FirstOnly:
    """Right at position 1 only: position 2 is one off the target's own greedy token."""

    def __init__(self, target: Target, vocab: int) -> None:
        self.oracle = OracleDraft(target)
        self.vocab = vocab

    def propose(self, tokens: Sequence[int], aux: Any, k: int) -> list[int]:
        first, second = self.oracle.propose(tokens, aux, 2)
        return [first, (second + 1) % self.vocab] + [0] * (k - 2)


# --------------------------------------------------------------------------- ordering


def test_oracle_scores_k_plus_one_and_is_lossless(setup: Setup) -> None:
    r = run(setup, OracleDraft(setup.target))
    assert r.lossless is True and r.lossless_prompts == N_PROMPTS
    assert r.vllm_style_acceptance_length == K + 1  # every draft token accepted
    assert r.per_position_rate == [1.0] * K
    # end effects only: the last step of a prompt may be cut by max_new_tokens / EOT
    assert K + 1 - N_PROMPTS * K / r.steps <= r.acceptance_length <= K + 1
    assert r.tokens == r.step_tokens + N_PROMPTS  # plus one prefill token per prompt


def test_partial_acceptance_counts_exactly(setup: Setup) -> None:
    r = run(setup, FirstOnly(setup.target, setup.spec.vocab_size))
    assert r.lossless is True
    assert r.accepted_per_pos == [r.steps, 0, 0]
    assert r.vllm_style_acceptance_length == 2.0
    assert r.per_position_conditional == [1.0, 0.0, None]


def test_untrained_draft_scores_about_one(setup: Setup, untrained: Any) -> None:
    r = run(setup, SpeculatorsDraft(untrained))
    assert r.lossless is True
    # at most vLLM's figure (end effects only cut), and next to nothing above 1 per step
    assert r.acceptance_length <= r.vllm_style_acceptance_length
    assert r.acceptance_length < 1.15


def test_trained_draft_beats_untrained(setup: Setup, untrained: Any, trained: Any) -> None:
    base = run(setup, SpeculatorsDraft(untrained))
    better = run(setup, SpeculatorsDraft(trained))
    assert better.lossless is True
    assert better.acceptance_length > base.acceptance_length
    assert better.acceptance_length > 1.2


# --------------------------------------------------------------------------- losslessness


def test_forward_check_gives_the_decoded_references_verdicts(setup: Setup, trained: Any) -> None:
    """One teacher-forced forward per answer (the default) and decoding the greedy
    reference token by token pass the same answers, with every count unchanged."""
    forward, _ = measure(
        setup.target, SpeculatorsDraft(trained), setup.prompts, K, MAX_NEW, setup.stops
    )
    decode, _ = measure(
        setup.target,
        SpeculatorsDraft(trained),
        setup.prompts,
        K,
        MAX_NEW,
        setup.stops,
        lossless_by="decode",
    )
    assert forward.lossless is True and forward.lossless_prompts == N_PROMPTS
    assert forward.to_dict() == decode.to_dict()


@pytest.mark.parametrize("kind", ["changed token", "early stop"])
def test_checks_name_where_an_answer_left_greedy_decoding(setup: Setup, kind: str) -> None:
    """An answer that is not the target's greedy one fails both checks at the same token,
    with the target's top-2 margin there (what the report prints beside a divergence)."""
    p = setup.prompts[0]
    greedy = greedy_decode(CachedTarget(setup.target), p.prompt_ids, MAX_NEW, setup.stops).tokens
    assert len(greedy) >= 4
    at = len(greedy) // 2  # before the last token, the only one that may be a stop token
    wrong = (greedy[at] + 1) % setup.spec.vocab_size
    if kind == "early stop":
        wrong = next(t for t in setup.stops if t != greedy[at])
    bad = (
        [*greedy[:at], wrong] if kind == "early stop" else [*greedy[:at], wrong, *greedy[at + 1 :]]
    )
    assert greedy_check(setup.target, p.prompt_ids, greedy).lossless is True
    by_forward = greedy_check(setup.target, p.prompt_ids, bad)
    by_decode = decode_check(CachedTarget(setup.target), p.prompt_ids, bad, MAX_NEW, setup.stops)
    assert (by_forward.lossless, by_forward.first_divergence) == (False, at)
    assert (by_decode.lossless, by_decode.first_divergence) == (False, at)
    assert by_forward.divergence_margin == pytest.approx(by_decode.divergence_margin, abs=1e-3)
    assert by_forward.divergence_margin is not None and by_forward.divergence_margin > 0


# --------------------------------------------------------------------------- the draft


def test_inference_chain_equals_speculators_ttt_forward(setup: Setup, trained: Any) -> None:
    """Our chained proposal == speculators' own forward fed the same tokens (its TTT step j
    at the last real position sees exactly what inference step j sees)."""
    draft = SpeculatorsDraft(trained)
    seq = setup.prompts[0].prompt_ids
    _, aux = setup.target.forward(seq)
    tokens = seq[:-1]  # context; its last token's state is not used by the draft
    n = len(tokens)
    proposed = draft.propose(tokens, aux[: n - 1], K)
    t2d_ids = []  # target -> draft ids through d2t
    d2t = trained.d2t.long()
    for tok in proposed:
        t2d_ids.append(int(((torch.arange(len(d2t)) + d2t) == tok).nonzero()[0, 0]))
    ids = torch.tensor([tokens[1:] + proposed[:-1]])
    hidden = torch.cat([aux[: n - 1], torch.zeros(K - 1, aux.shape[1])])[None]
    with torch.no_grad():
        out = trained(
            hidden_states=hidden, input_ids=ids, document_ids=torch.zeros_like(ids), ttt_steps=K
        )
    assert [int(out[j][0, n - 2]) for j in range(K)] == t2d_ids


@pytest.mark.parametrize(
    "options",
    [
        {"norm_before_fc": True, "norm_output": True},  # speculators' and our defaults
        {"fc_norm": True, "norm_before_fc": False, "norm_output": False},
        {"norm_before_fc": False, "norm_output": False},  # plain EAGLE-3
    ],
)
def test_inference_chain_follows_the_eagle31_options(setup: Setup, options: dict) -> None:
    """With the EAGLE-3.1 norms (weights moved off their init of ones, so a skipped norm
    shows) our chained proposal is still speculators' own TTT forward."""
    draft = new_draft(setup, seed=1, **options)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if "input_norm" in name or "fc_norm" in name or name == "norm.weight":
                p.mul_(torch.rand_like(p) + 0.5)
    assert (draft.input_norm is not None) == options.get("norm_before_fc", False)
    assert draft.config.norm_output == options.get("norm_output", False)
    seq = setup.prompts[1].prompt_ids
    _, aux = setup.target.forward(seq)
    tokens = seq[:-1]
    n = len(tokens)
    proposed = SpeculatorsDraft(draft).propose(tokens, aux[: n - 1], K)
    d2t = draft.d2t.long()
    draft_ids = [int(((torch.arange(len(d2t)) + d2t) == t).nonzero()[0, 0]) for t in proposed]
    ids = torch.tensor([tokens[1:] + proposed[:-1]])
    hidden = torch.cat([aux[: n - 1], torch.zeros(K - 1, aux.shape[1])])[None]
    with torch.no_grad():
        out = draft(
            hidden_states=hidden, input_ids=ids, document_ids=torch.zeros_like(ids), ttt_steps=K
        )
    assert [int(out[j][0, n - 2]) for j in range(K)] == draft_ids


def test_stops_at_end_of_turn(setup: Setup) -> None:
    """The EOT token ends the answer even inside an accepted run of draft tokens."""
    p = setup.prompts[0]
    stop = [setup.target.forward(p.prompt_ids)[0][-1].argmax().item()]  # first token
    r = speculative_decode(setup.target, OracleDraft(setup.target), p, K, MAX_NEW, stop)
    assert r.tokens == stop and r.steps == 0


# --------------------------------------------------------------------------- prompts


def test_load_prompts_names_bad_rows(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        json.dumps({"id": "a", "prompt_ids": [1, 2]})
        + "\n"
        + json.dumps({"id": "b", "prompt_ids": []})
        + "\n"
    )
    with pytest.raises(ConfigError, match=r"prompts.jsonl:2: 'prompt_ids'"):
        load_prompts(path)
    path.write_text(json.dumps({"id": "a", "prompt_ids": [1, 9999]}) + "\n")
    with pytest.raises(ConfigError, match="outside the target vocabulary"):
        load_prompts(path, vocab_size=2048)
    path.write_text(json.dumps({"id": "a", "prompt_ids": [1, 2]}) + "\n")
    assert load_prompts(path) == [Prompt("a", [1, 2])]
    # a blank line still counts: the error names the file's own line number
    path.write_text(json.dumps({"id": "a", "prompt_ids": [1]}) + "\n\n" + '{"id": "b"}\n')
    with pytest.raises(ConfigError, match=r"prompts.jsonl:3: 'prompt_ids'"):
        load_prompts(path)
    path.write_text("\n[1]\n")
    with pytest.raises(ConfigError, match=r"prompts.jsonl:2: not a JSON object"):
        load_prompts(path)


# --------------------------------------------------------------------------- KV caches


def _same_decoding(s: Setup, draft: Any, max_new: int) -> Any:
    """Both evaluators on the same prompts: identical tokens and counts, prompt by prompt
    (the pooled result returned)."""
    sd = SpeculatorsDraft(draft)
    plain, plain_rows = measure(s.target, sd, s.prompts, K, max_new, s.stops)
    cached, cached_rows = measure(s.target, sd, s.prompts, K, max_new, s.stops, kv_cache=True)
    assert cached.to_dict() == plain.to_dict()
    for a, b in zip(plain_rows, cached_rows, strict=True):
        assert dataclasses.asdict(a) == dataclasses.asdict(b)
    return plain


def test_kv_cache_evaluator_is_identical_on_tiny_kimi(
    setup: Setup, trained: Any, untrained: Any
) -> None:
    r = _same_decoding(setup, trained, 48)
    assert r.accepted == K * r.steps  # every draft kept: the caches only grow
    r = _same_decoding(setup, untrained, 48)
    assert r.accepted == 0  # every draft rejected: the target's cache rolls back K each step


def test_kv_cache_evaluator_is_identical_on_tiny_llama(
    tiny_llama_target: Path, single_thread: None
) -> None:
    s = make_setup(tiny_llama_target)
    try:
        r = _same_decoding(s, train_draft(s, 60), 48)
        # some steps keep only part of the K drafts: rollbacks of 1..K-1 positions
        assert r.accepted_per_pos[0] > r.accepted_per_pos[-1], r.accepted_per_pos
    finally:
        s.target.close()
