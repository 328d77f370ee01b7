"""On-policy regeneration: every assistant turn replaced by the target's own answer.

The draft learns to predict the target's next tokens, so the supervised tokens must be
exactly what the target emits: the token ids it generated, kept as generated (never
decoded and re-tokenized), reasoning block included, through its end-of-turn token.
Turns are regenerated in order: turn k's context holds the target's own answers to turns
< k (rendered back to text by the chat template, as a server does at inference).

Backends:

- ``hf``: batched greedy ``generate`` in-process (left padding, stop at end-of-turn).
- ``server``: an OpenAI-compatible chat-completions server that returns token ids. The
  request and response shape is the one speculators 0.9's ``regenerate-responses`` uses
  against vLLM: ``"return_token_ids": true`` in the request, ``prompt_token_ids`` at the
  top of the response and ``choices[0].token_ids`` for the completion (vLLM includes the
  stop token there). We speak that protocol but do not call ``regenerate-responses``:
  (1) it reads a dataset file or preset and writes its own JSONL, while we hold
  normalised conversations in memory and need rows aligned with our selection;
  (2) its ``regenerate_conversation`` ends a conversation when prompt + completion
  exceed ``max_tokens``, i.e. it treats the per-turn generation budget as a sequence
  budget, which would cut every multi-turn conversation after its first turn here;
  (3) its HTTP session has no total or read timeout (``ClientTimeout(total=None,
  sock_read=None)``), so a hung server hangs the stage; (4) importing it imports
  speculators (~7 s), aiohttp and typer. Its retry policy is kept: transient statuses
  (408/409/425/429/5xx), timeouts and connection errors are retried with exponential
  backoff; other statuses fail at once. A request that still fails is counted by reason
  and its conversation stops there -- it never becomes an empty answer.

Resume: every generation is appended to a JSONL cache keyed by a fingerprint of the
target and the generation settings plus a hash of the request's messages; a rerun after
a crash (or a larger ``train.samples``, whose conversations extend the smaller run's)
only generates what is missing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from eagle3_pipeline.core.config import ConfigError
from eagle3_pipeline.data.conversations import Row, render_ids
from eagle3_pipeline.targets.tiny import REASONING_MARKERS
from eagle3_pipeline.serving.server import engine_server

log = logging.getLogger(__name__)

RETRYABLE_HTTP_STATUSES = {408, 409, 425, 429}
SHUTDOWN_TIMEOUT_S = 30.0  # a started server: SIGTERM to SIGKILL


class ServerUnavailable(ConnectionError):
    """The regeneration server cannot be reached or started (the whole stage fails)."""


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


class Backend(Protocol):
    name: str

    def generate(self, requests: list[Request], on_done: Callable[[int], None]) -> list[Result]: ...

    def fingerprint(self) -> dict[str, Any]: ...


# --------------------------------------------------------------------------- hf backend


class HFBackend:
    """Batched greedy generation with the target loaded in-process (CPU or GPU)."""

    name = "hf"

    def __init__(
        self,
        model_dir: str | Path,
        eot_ids: list[int],
        pad_id: int,
        max_new_tokens: int,
        batch_size: int,
        device: str = "cpu",
        dtype: str = "float32",
        model: Any = None,
    ) -> None:
        from eagle3_pipeline.targets.tiny import load_target_model

        self.model_dir = Path(model_dir)
        self.eot_ids = list(eot_ids)
        self.pad_id = pad_id
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.device = device
        self.model = model if model is not None else load_target_model(self.model_dir, dtype)
        self.model.to(device)

    def fingerprint(self) -> dict[str, Any]:
        files = sorted(
            (p.name, p.stat().st_size, p.stat().st_mtime_ns)
            for p in self.model_dir.iterdir()
            if p.is_file()
        )
        return {
            "backend": self.name,
            "model_files": files,
            "max_new_tokens": self.max_new_tokens,
            "eot": self.eot_ids,
            "device": self.device,
            "dtype": str(next(self.model.parameters()).dtype),
        }

    def generate(self, requests: list[Request], on_done: Callable[[int], None]) -> list[Result]:
        import torch

        results: list[Result | None] = [None] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_ids))
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            prompts = [requests[i].prompt_ids for i in batch]
            width = max(len(p) for p in prompts)
            ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for k, p in enumerate(prompts):  # left padding: every prompt ends at `width`
                ids[k, width - len(p) :] = torch.tensor(p, dtype=torch.long)
                mask[k, width - len(p) :] = 1
            with torch.no_grad():
                out = self.model.generate(
                    input_ids=ids.to(self.device),
                    attention_mask=mask.to(self.device),
                    max_new_tokens=self.max_new_tokens,
                    do_sample=False,
                    eos_token_id=self.eot_ids,
                    pad_token_id=self.pad_id,
                )
            for k, i in enumerate(batch):
                gen = out[k, width:].tolist()
                end = next((n for n, t in enumerate(gen) if t in self.eot_ids), None)
                results[i] = Generation(list(prompts[k]), gen if end is None else gen[: end + 1])
            on_done(len(batch))
        return [r for r in results if r is not None]


# --------------------------------------------------------------------------- server backend


class ServerBackend:
    """Chat completions against an OpenAI-compatible server that returns token ids."""

    name = "server"

    def __init__(
        self,
        base_url: str,
        max_new_tokens: int,
        model: str | None = None,
        concurrency: int = 8,
        timeout_s: float = 300.0,
        retries: int = 3,
        temperature: float = 0.0,
        backoff_s: float = 1.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.max_new_tokens = max_new_tokens
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.retries = retries
        self.temperature = temperature
        self.backoff_s = backoff_s
        self._client: Any = None
        self.model = model or self.detect_model()

    @property
    def client(self) -> Any:
        """The ``openai`` client (retries are ours: each failure kind is counted)."""
        if self._client is None:
            from openai import OpenAI

            self._client = OpenAI(base_url=self.base_url, api_key="EMPTY",
                                  timeout=self.timeout_s, max_retries=0)
        return self._client

    def detect_model(self) -> str:
        url = f"{self.base_url}/models"
        try:
            return str(self.client.with_options(timeout=min(self.timeout_s, 30.0))
                       .models.list().data[0].id)
        except Exception as exc:  # openai's errors, an empty list, a non-JSON answer
            raise ServerUnavailable(
                f"data.server.base_url={self.base_url}: cannot list models at {url} "
                f"({type(exc).__name__}: {exc}); is the server up? (or set data.server.model)"
            ) from None

    def fingerprint(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "base_url": self.base_url,
            "model": self.model,
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
        }

    def _complete(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        resp = self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=self.max_new_tokens,
            temperature=self.temperature,
            # vLLM: prompt_token_ids + choices[].token_ids
            extra_body={"return_token_ids": True, "skip_special_tokens": False},
        )
        return resp.model_dump()

    def request(self, messages: list[dict[str, Any]]) -> Result:
        import openai

        failure = Failure("unknown", "no attempt made")
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), 30.0))
            try:
                data = self._complete(messages)
            except openai.APIStatusError as exc:
                code = exc.status_code
                failure = Failure(f"http_{code}", f"HTTP {code}: {str(exc)[:300]}")
                if code < 500 and code not in RETRYABLE_HTTP_STATUSES:
                    return failure
                continue
            except openai.APITimeoutError:
                failure = Failure("timeout", f"no answer within {self.timeout_s} s")
                continue
            except openai.APIConnectionError as exc:
                failure = Failure("connection", f"{type(exc).__name__}: {exc.__cause__ or exc}")
                continue
            except (openai.APIResponseValidationError, ValueError) as exc:
                failure = Failure("bad_response", f"not a chat completion: {exc}")
                continue
            return parse_completion(data)
        return failure

    def generate(self, requests: list[Request], on_done: Callable[[int], None]) -> list[Result]:
        def one(r: Request) -> Result:
            try:
                return self.request(r.messages)
            finally:
                on_done(1)

        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(one, requests))


def parse_completion(data: Any) -> Result:
    """A chat-completion response -> the prompt and completion token ids, or why not."""
    try:
        prompt = data["prompt_token_ids"]
        tokens = data["choices"][0]["token_ids"]
    except (KeyError, IndexError, TypeError):
        return Failure(
            "no_token_ids",
            "the response carries no prompt_token_ids / choices[0].token_ids: the server "
            "must support return_token_ids (vLLM does)",
        )
    if not prompt or not tokens or not all(isinstance(t, int) for t in [*prompt, *tokens]):
        return Failure("no_token_ids", "empty or non-integer token ids in the response")
    return Generation(list(prompt), list(tokens))


# --------------------------------------------------------------------------- vllm serve


@contextlib.contextmanager
def managed_server(
    engine: Any, python: str | Path, base_url: str, startup_timeout_s: float,
    shutdown_timeout_s: float, log_path: Path,
) -> Iterator[subprocess.Popen[bytes]]:
    """Serve ``engine`` (an :class:`~eagle3_pipeline.serving.engine.Engine`) with the vLLM
    environment's ``python`` at ``base_url``'s port, wait until ``base_url/models``
    answers, and ALWAYS stop it (its whole process group: vLLM forks workers) when the
    block exits. Failing to start raises ``ServerUnavailable``, which the stage reports."""
    url = urlparse(base_url)
    server = engine_server(
        engine, python, url.port or 8000, log_path, startup_timeout_s, shutdown_timeout_s,
        health_path=url.path.rstrip("/") + "/models", error=ServerUnavailable,
    )
    with server:
        assert server.proc is not None
        yield server.proc


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
    messages: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """(leading history, segments): an answer is generated after each segment. Segments
    end where the recorded conversation had an assistant turn, and after a trailing
    user turn; an assistant turn before any user turn stays as recorded history."""
    lead: list[dict[str, Any]] = []
    segments: list[list[dict[str, Any]]] = []
    buf: list[dict[str, Any]] = []
    seen_user = False
    for m in messages:
        if m["role"] == "assistant":
            if seen_user:
                segments.append(buf)
                buf = []
            elif not segments:
                lead.extend([*buf, m])
                buf = []
            continue
        seen_user = seen_user or m["role"] == "user"
        buf.append({"role": m["role"], "content": m["content"]})
    if any(m["role"] == "user" for m in buf):
        segments.append(buf)
    return lead, segments


@dataclass
class Reasoning:
    """Token-level handling of the ``<think>...</think>`` block in generated ids."""

    tokenizer: Any
    mode: str = "keep"
    open_id: int | None = None
    close_id: int | None = None

    def __post_init__(self) -> None:
        vocab = self.tokenizer.get_vocab()
        self.open_id = vocab.get(REASONING_MARKERS[0])
        self.close_id = vocab.get(REASONING_MARKERS[1])
        if self.mode == "drop" and (self.open_id is None or self.close_id is None):
            raise ConfigError(
                "data.reasoning=drop with regeneration needs <think> and </think> as single "
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
        op, cl = REASONING_MARKERS
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "cached": self.cached,
            "generated_tokens": self.generated_tokens,
            "unfinished_turns": self.unfinished_turns,
            "prompt_mismatch": self.prompt_mismatch,
            "failed_requests": sum(self.errors.values()),
            "wall_s": round(self.wall_s, 3),
        }


def regenerate_rows(
    convs: list[dict[str, Any]],
    backend: Backend,
    tokenizer: Any,
    eot_ids: list[int],
    max_seq_len: int,
    reasoning: str = "keep",
    cache: GenerationCache | None = None,
    progress: bool = True,
) -> tuple[list[Row], RegenStats]:
    """Rows whose supervised tokens are the target's own answers, turn by turn.

    All conversations advance one turn per round, so a round is one batch of requests.
    A failed request stops its conversation (earlier turns keep their rows); a context
    that already fills ``max_seq_len`` stops it too (nothing left to supervise).
    """
    from tqdm import tqdm

    cache = cache or GenerationCache(None)
    think = Reasoning(tokenizer, reasoning)
    stats = RegenStats()
    t0 = time.perf_counter()
    plans = [plan_turns(c["messages"]) for c in convs]
    history = [list(lead) for lead, _ in plans]
    rows: list[list[Row]] = [[] for _ in convs]
    active = [i for i, (_, segs) in enumerate(plans) if segs]
    bar = tqdm(
        total=sum(len(s) for _, s in plans), desc=f"regenerate ({backend.name})",
        unit="turn", disable=not progress, mininterval=1.0,
    )  # fmt: skip
    rnd = 0
    while active:
        pending: list[tuple[int, Request]] = []
        results: dict[int, Result] = {}
        for i in active:
            msgs = history[i] + plans[i][1][rnd]
            history[i] = msgs
            hit = cache.get(msgs)
            if hit is not None:
                results[i] = hit
                stats.cached += 1
                bar.update(1)
                continue
            prompt = render_ids(tokenizer, msgs, generation_prompt=True)
            if len(prompt) >= max_seq_len:
                stats.dropped["no_supervised_tokens"] += len(plans[i][1]) - rnd
                bar.update(len(plans[i][1]) - rnd)
                continue
            pending.append((i, Request(msgs, prompt)))
        if pending:
            out = backend.generate([r for _, r in pending], bar.update)
            stats.requests += len(pending)
            for (i, req), res in zip(pending, out, strict=True):
                results[i] = res
                if isinstance(res, Generation):
                    cache.put(req.messages, res)
                    stats.prompt_mismatch += res.prompt_ids != req.prompt_ids
        nxt = []
        for i, res in sorted(results.items()):
            if isinstance(res, Failure):
                stats.errors[f"regenerate_{res.reason}"] += 1
                log.warning("%s turn %d: generation failed: %s", convs[i]["id"], rnd, res.message)
                continue
            stats.generated_tokens += len(res.token_ids)
            stats.unfinished_turns += not (res.token_ids and res.token_ids[-1] in eot_ids)
            rows[i].append(
                Row(convs[i]["id"], rnd, res.prompt_ids, think.supervised(res.token_ids))
            )
            history[i] = history[i] + [think.message(res.token_ids, eot_ids)]
            if rnd + 1 < len(plans[i][1]):
                nxt.append(i)
        active = nxt
        rnd += 1
    bar.close()
    stats.wall_s = time.perf_counter() - t0
    return [r for conv_rows in rows for r in conv_rows], stats
