"""What every regeneration backend shares -- requests, results, the resume cache -- and the
turn-by-turn loop that replaces each assistant turn by the target's own answer (the
package's docstring says why and how it resumes)."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from eagle3_pipeline.core.config import ConfigError
from eagle3_pipeline.data.conversation import Conversation
from eagle3_pipeline.data.record import Regeneration
from eagle3_pipeline.data.rows import Row
from eagle3_pipeline.targets.chat import render_ids

log = logging.getLogger(__name__)


@dataclass
class Request:
    messages: list[dict[str, Any]]
    prompt_ids: list[int]  # the generation-prompt render of ``messages`` (local tokenizer)


@dataclass
class Generation:
    prompt_ids: list[int]  # what the backend actually conditioned on
    token_ids: list[int]  # exactly what it generated, end-of-turn included when reached


@dataclass
class Failure:
    reason: str
    message: str


Result = Generation | Failure


OnResult = Callable[[int, Result], None]


class Backend(Protocol):
    """Generates a round's requests. ``on_result(k, result)`` is called in the caller's
    thread as soon as ``requests[k]`` is finished, once per request: the loop caches each
    answer then, so an interrupted round keeps every answer it already has."""

    name: str

    def generate(self, requests: list[Request], on_result: OnResult) -> None: ...

    def fingerprint(self) -> dict[str, Any]: ...


# --------------------------------------------------------------------------- cache


class GenerationCache:
    """Append-only JSONL of finished generations, keyed by request messages; a torn last
    line (a crash mid-write) is ignored on reading."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[str, Generation] = {}
        if path is not None and path.is_file():
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    obj = json.loads(line)
                    self.entries[obj["key"]] = Generation(obj["prompt_ids"], obj["token_ids"])
                except (ValueError, KeyError, TypeError):
                    continue

    @staticmethod
    def key(messages: list[dict[str, Any]]) -> str:
        blob = json.dumps(messages, sort_keys=True, ensure_ascii=False).encode("utf-8")
        return hashlib.sha256(blob).hexdigest()

    def get(self, messages: list[dict[str, Any]]) -> Generation | None:
        return self.entries.get(self.key(messages))

    def put(self, messages: list[dict[str, Any]], gen: Generation) -> None:
        k = self.key(messages)
        self.entries[k] = gen
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"key": k, "prompt_ids": gen.prompt_ids, "token_ids": gen.token_ids})
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def cache_path(cache_dir: Path, fingerprint: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir / f"{fingerprint['backend']}-{digest}.jsonl"


# --------------------------------------------------------------------------- orchestration


def plan_turns(
    conv: Conversation,
) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """(leading history, segments) as chat-template messages: an answer is generated
    after each segment. Segments end where the recorded conversation had an assistant
    turn, and after a trailing user turn; an assistant turn before any user turn stays as
    recorded history (its reasoning too)."""
    lead: list[dict[str, Any]] = []
    segments: list[list[dict[str, Any]]] = []
    buf: list[dict[str, Any]] = []
    seen_user = False
    for m in conv.messages:
        if m.role == "assistant":
            if seen_user:
                segments.append(buf)
                buf = []
            elif not segments:
                lead.extend([*buf, m.chat()])
                buf = []
            continue
        seen_user = seen_user or m.role == "user"
        buf.append(m.chat(reasoning=False))
    if any(m["role"] == "user" for m in buf):
        segments.append(buf)
    return lead, segments


@dataclass
class ReasoningMarkers:
    """Token-level handling of the reasoning block in generated ids, between ``markers``:
    the target family's open / close (``<think>``, ``</think>``), or none."""

    tokenizer: Any
    mode: str = "keep"
    open_id: int | None = None
    close_id: int | None = None
    markers: tuple[str, ...] = field(kw_only=True)

    def __post_init__(self) -> None:
        vocab = self.tokenizer.get_vocab()
        op, cl = self.markers or (None, None)
        self.open_id = vocab.get(op) if op is not None else None
        self.close_id = vocab.get(cl) if cl is not None else None
        if self.mode == "drop" and not self.markers:
            raise ConfigError(
                "data.reasoning=drop with regeneration needs the reasoning markers of the "
                "target's family, and its family (targets/families/) declares none"
            )
        if self.mode == "drop" and (self.open_id is None or self.close_id is None):
            raise ConfigError(
                f"data.reasoning=drop with regeneration needs {op} and {cl} as single "
                "tokens of the target's tokenizer (the reasoning is cut at the token level)"
            )

    def supervised(self, ids: list[int]) -> list[int]:
        """The ids to supervise: all of them, or with the reasoning between the markers
        cut (the markers stay, as the template renders a turn without reasoning)."""
        if self.mode == "keep" or self.open_id not in ids or self.close_id not in ids:
            return ids
        a, b = ids.index(self.open_id), ids.index(self.close_id)
        return ids[: a + 1] + ids[b:] if a < b else ids

    def message(self, ids: list[int], eot_ids: list[int]) -> dict[str, Any]:
        """The assistant message the generated ids stand for, for later turns' context."""
        body = ids[:-1] if ids and ids[-1] in eot_ids else ids
        text = self.tokenizer.decode(body, skip_special_tokens=False)
        msg: dict[str, Any] = {"role": "assistant", "content": text}
        if not self.markers:
            return msg
        op, cl = self.markers
        if op in text and cl in text and text.index(op) < text.index(cl):
            head, _, rest = text.partition(op)
            reasoning, _, content = rest.partition(cl)
            msg["content"] = head + content
            if reasoning:
                msg["reasoning_content"] = reasoning
        return msg


@dataclass
class RegenStats:
    requests: int = 0
    cached: int = 0
    generated_tokens: int = 0
    unfinished_turns: int = 0  # hit max_new_tokens before the end-of-turn token
    # the backend conditioned on other ids than our render of the same messages (a server
    # with another chat template): its ids are used, since they are what it serves
    prompt_mismatch: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
    wall_s: float = 0.0

    def summary(self) -> Regeneration:
        """What prepare's record keeps (the errors and drops go to its own counters)."""
        return Regeneration(
            requests=self.requests,
            cached=self.cached,
            generated_tokens=self.generated_tokens,
            unfinished_turns=self.unfinished_turns,
            prompt_mismatch=self.prompt_mismatch,
            failed_requests=sum(self.errors.values()),
            wall_s=round(self.wall_s, 3),
        )


class _Rounds:
    """The state of one regeneration: each conversation's history so far, its rows, and
    which conversations still have a turn to generate. One round = one turn of each."""

    def __init__(
        self,
        convs: list[Conversation],
        backend: Backend,
        tokenizer: Any,
        eot_ids: list[int],
        max_seq_len: int,
        think: ReasoningMarkers,
        cache: GenerationCache,
        progress: bool,
    ) -> None:
        from tqdm import tqdm

        self.convs, self.backend, self.tokenizer = convs, backend, tokenizer
        self.eot_ids, self.max_seq_len, self.think, self.cache = eot_ids, max_seq_len, think, cache
        self.stats = RegenStats()
        self.plans = [plan_turns(c) for c in convs]
        self.history = [list(lead) for lead, _ in self.plans]
        self.rows: list[list[Row]] = [[] for _ in convs]
        self.bar = tqdm(
            total=sum(len(s) for _, s in self.plans),
            desc=f"regenerate ({backend.name})",
            unit="turn",
            disable=not progress,
            mininterval=1.0,
        )

    def first(self) -> list[int]:
        return [i for i, (_, segs) in enumerate(self.plans) if segs]

    def requests(
        self, rnd: int, active: list[int]
    ) -> tuple[list[tuple[int, Request]], dict[int, Result]]:
        """Turn ``rnd`` of each active conversation: answered from the cache, dropped when
        its context already fills ``max_seq_len`` (nothing left to supervise), or a request."""
        pending: list[tuple[int, Request]] = []
        results: dict[int, Result] = {}
        for i in active:
            msgs = self.history[i] + self.plans[i][1][rnd]
            self.history[i] = msgs
            hit = self.cache.get(msgs)
            if hit is not None:
                results[i] = hit
                self.stats.cached += 1
                self.bar.update(1)
                continue
            prompt = render_ids(self.tokenizer, msgs, generation_prompt=True)
            if len(prompt) >= self.max_seq_len:
                left = len(self.plans[i][1]) - rnd
                self.stats.dropped["no_supervised_tokens"] += left
                self.bar.update(left)
                continue
            pending.append((i, Request(msgs, prompt)))
        return pending, results

    def generate(self, pending: list[tuple[int, Request]], results: dict[int, Result]) -> None:
        """Generate ``pending``; each answer is cached as it arrives (a round on a large
        target can take hours, and a crash must not lose the part already done)."""

        def finished(k: int, res: Result) -> None:
            i, req = pending[k]
            results[i] = res
            self.stats.requests += 1
            self.bar.update(1)
            if isinstance(res, Generation):
                self.cache.put(req.messages, res)
                self.stats.prompt_mismatch += res.prompt_ids != req.prompt_ids

        self.backend.generate([r for _, r in pending], finished)
        missing = [i for i, _ in pending if i not in results]
        if missing:
            raise RuntimeError(
                f"the {self.backend.name} backend returned no result for {len(missing)} of "
                f"{len(pending)} requests (conversation {self.convs[missing[0]].id})"
            )

    def advance(self, rnd: int, results: dict[int, Result]) -> list[int]:
        """Record turn ``rnd``'s answers; return the conversations with a next turn (a
        failed request stops its conversation, earlier turns keep their rows)."""
        nxt = []
        for i, res in sorted(results.items()):
            if isinstance(res, Failure):
                self.stats.errors[f"regenerate_{res.reason}"] += 1
                log.warning("%s turn %d: generation failed: %s", self.convs[i].id, rnd, res.message)
                continue
            self.stats.generated_tokens += len(res.token_ids)
            self.stats.unfinished_turns += not (res.token_ids and res.token_ids[-1] in self.eot_ids)
            self.rows[i].append(
                Row(
                    self.convs[i].id,
                    rnd,
                    res.prompt_ids,
                    self.think.supervised(res.token_ids),
                    answer=rnd,
                )
            )
            self.history[i] = self.history[i] + [self.think.message(res.token_ids, self.eot_ids)]
            if rnd + 1 < len(self.plans[i][1]):
                nxt.append(i)
        return nxt


def regenerate_rows(
    convs: list[Conversation],
    backend: Backend,
    tokenizer: Any,
    eot_ids: list[int],
    max_seq_len: int,
    reasoning: str = "keep",
    cache: GenerationCache | None = None,
    progress: bool = True,
    *,
    markers: tuple[str, ...],
) -> tuple[list[Row], RegenStats]:
    """Rows whose supervised tokens are the target's own answers, turn by turn.

    All conversations advance one turn per round, so a round is one batch of requests.
    A failed request stops its conversation (earlier turns keep their rows); a context
    that already fills ``max_seq_len`` stops it too (nothing left to supervise).
    ``markers``: the reasoning block's open / close of the target's family (the caller
    asks the family registry), ``()`` when it has none.
    """
    cache = cache or GenerationCache(None)
    think = ReasoningMarkers(tokenizer, reasoning, markers=markers)
    t0 = time.perf_counter()
    state = _Rounds(convs, backend, tokenizer, eot_ids, max_seq_len, think, cache, progress)
    active = state.first()
    rnd = 0
    while active:
        pending, results = state.requests(rnd, active)
        if pending:
            state.generate(pending, results)
        active = state.advance(rnd, results)
        rnd += 1
    state.bar.close()
    state.stats.wall_s = time.perf_counter() - t0
    return [r for conv_rows in state.rows for r in conv_rows], state.stats
