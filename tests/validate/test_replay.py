"""The replay evaluator (T=0, target batched across prompts) against chained speculative
decoding: identical tokens, counts and verdicts, prompt by prompt, on the tiny Kimi-K2.5
(MLA, MoE) and the tiny Llama, with drafts that keep every token, none, and some."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acceptance_setup import K, Setup, make_setup, new_draft, train_draft

from eagle3_pipeline.core.config import ConfigError
from eagle3_pipeline.validate import replay
from eagle3_pipeline.validate.acceptance import Prompt, SpeculatorsDraft, measure


@pytest.fixture(scope="module")
def kimi(tiny_target: Path, single_thread: None) -> Iterator[Setup]:
    s = make_setup(tiny_target)
    yield s
    s.target.close()


def _prompts(s: Setup) -> list[Prompt]:
    """The setup's prompts plus shorter cuts of them: rows of different lengths, so the
    batch is left-padded."""
    cuts = [
        Prompt(f"{p.id}-cut", p.prompt_ids[: max(2, len(p.prompt_ids) // 2)]) for p in s.prompts
    ]
    return [*s.prompts, *cuts]


def _same(s: Setup, draft: Any, max_new: int, batch_size: int) -> Any:
    sd = SpeculatorsDraft(draft)
    prompts = _prompts(s)
    chained, chained_rows = measure(s.target, sd, prompts, K, max_new, s.stops, kv_cache=True)
    replayed, replayed_rows = replay.measure(
        s.target, sd, prompts, K, max_new, s.stops, batch_size=batch_size
    )
    for a, b in zip(chained_rows, replayed_rows, strict=True):
        assert dataclasses.asdict(a) == dataclasses.asdict(b), a.id
    assert replayed.to_dict() == chained.to_dict()
    return chained


def test_replay_equals_chained_decoding_on_tiny_kimi(kimi: Setup) -> None:
    trained = train_draft(kimi, 120)
    r = _same(kimi, trained, 48, batch_size=3)
    assert r.accepted > 0 and r.lossless
    r = _same(kimi, new_draft(kimi), 48, batch_size=8)
    assert r.accepted == 0


def test_replay_equals_chained_decoding_on_tiny_llama(
    tiny_llama_target: Path, single_thread: None
) -> None:
    s = make_setup(tiny_llama_target)
    try:
        r = _same(s, train_draft(s, 60), 48, batch_size=5)
        # some steps keep only part of the K drafts, and some answers end on a stop token
        assert r.accepted_per_pos[0] > r.accepted_per_pos[-1], r.accepted_per_pos
    finally:
        s.target.close()


def test_batched_answers_are_the_targets_greedy_ones(kimi: Setup) -> None:
    """Every row of a left-padded batch continues as that prompt alone would, carried K
    tokens past its end."""
    prompts = _prompts(kimi)
    ys = replay.greedy_batch(kimi.target, [p.prompt_ids for p in prompts], K, 20, kimi.stops)
    for p, y in zip(prompts, ys, strict=True):
        alone = replay.greedy_batch(kimi.target, [p.prompt_ids], K, 20, kimi.stops)[0]
        assert y == alone, p.id
        assert len(y) == replay.needed(y, K, 20, set(kimi.stops))


def test_needed_counts_the_answer_and_k_more() -> None:
    assert replay.needed([5, 6, 7], 3, 10, {7}) == 6  # a stop at index 2
    assert replay.needed([5, 6], 3, 10, {7}) is None  # not ended yet
    assert replay.needed([5] * 10, 3, 10, {7}) == 13  # the length cap
    assert replay.needed([5] * 9 + [7], 2, 10, {7}) == 12  # a stop as the last token


def test_a_replay_short_of_tokens_is_an_error() -> None:
    r = replay.Replay(prompt_len=2, y=[1, 2], aux=None)
    with pytest.raises(ValueError, match="needs more"):
        r.verify_ids([0, 0, 1], [5, 5, 5])


def test_bad_settings_are_one_line_errors(kimi: Setup) -> None:
    sd = SpeculatorsDraft(new_draft(kimi))
    with pytest.raises(ConfigError, match="batch_size=0"):
        replay.measure(kimi.target, sd, kimi.prompts, K, 8, kimi.stops, batch_size=0)
    with pytest.raises(ConfigError, match="K=0"):
        replay.measure(kimi.target, sd, kimi.prompts, 0, 8, kimi.stops)


def test_an_answer_off_the_greedy_path_is_decoded_chained(
    kimi: Setup, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The guard: a batched answer the teacher-forced forward does not reproduce (here one
    token changed) is never replayed; that prompt is decoded by the chained evaluator, so
    the figures are still the chained ones."""
    real = replay.greedy_batch

    def one_token_off(*args: Any, **kwargs: Any) -> list[list[int]]:
        ys = real(*args, **kwargs)
        ys[0][2] = (ys[0][2] + 1) % kimi.target.lm.model.config.vocab_size
        return ys

    monkeypatch.setattr(replay, "greedy_batch", one_token_off)
    caplog.set_level(logging.INFO, logger=replay.__name__)
    prompts = _prompts(kimi)  # two batches of 4: the first row of each is changed
    plans = replay.replays(kimi.target, prompts, K, 24, kimi.stops, batch_size=4)
    assert [p is None for p in plans] == [True, False, False, False, True, False, False, False]
    assert "left the greedy path" in caplog.text
    _same(kimi, new_draft(kimi, seed=1), 24, batch_size=4)
