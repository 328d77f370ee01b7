"""The ``server`` regeneration backend: an OpenAI-compatible chat-completions server that
returns token ids, and ``vllm serve`` started for the run when ``data.server.start``.

The request and response shape is the one speculators 0.9's ``regenerate-responses`` uses
against vLLM: ``"return_token_ids": true`` in the request, ``prompt_token_ids`` at the top
of the response and ``choices[0].token_ids`` for the completion (vLLM includes the stop
token there). We speak that protocol but do not call ``regenerate-responses``:
(1) it reads a dataset file or preset and writes its own JSONL, while we hold normalised
conversations in memory and need rows aligned with our selection;
(2) its ``regenerate_conversation`` ends a conversation when prompt + completion exceed
``max_tokens``, i.e. it treats the per-turn generation budget as a sequence budget, which
would cut every multi-turn conversation after its first turn here;
(3) its HTTP session has no total or read timeout (``ClientTimeout(total=None,
sock_read=None)``), so a hung server hangs the stage; (4) importing it imports speculators
(~7 s), aiohttp and typer. Its retry policy is kept: transient statuses (408/409/425/429/
5xx), timeouts and connection errors are retried with exponential backoff; other statuses
fail at once. A request that still fails is counted by reason and its conversation stops
there -- it never becomes an empty answer.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from eagle3_pipeline.data.regenerate.turns import Failure, Generation, OnResult, Request, Result
from eagle3_pipeline.serving.identity import ExpectedModel, ServerUnreachable, verify_server
from eagle3_pipeline.serving.server import VllmServer, engine_server

RETRYABLE_HTTP_STATUSES = {408, 409, 425, 429}


class ServerUnavailable(ConnectionError):
    """The regeneration server cannot be reached or started (the whole stage fails)."""


class ServerBackend:
    """Chat completions against an OpenAI-compatible server that returns token ids."""

    name = "server"

    def __init__(
        self,
        base_url: str,
        max_new_tokens: int,
        *,
        expected: ExpectedModel,
        model: str | None = None,
        api_key: str | None = None,
        concurrency: int = 8,
        timeout_s: float = 300.0,
        retries: int = 3,
        temperature: float = 0.0,
        backoff_s: float = 1.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.max_new_tokens = max_new_tokens
        self.api_key = api_key
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.retries = retries
        self.temperature = temperature
        self.backoff_s = backoff_s
        self._client: Any = None
        self.model = self.verify(expected, model)

    @property
    def client(self) -> Any:
        """The ``openai`` client (retries are ours: each failure kind is counted)."""
        if self._client is None:
            from openai import OpenAI

            self._client = OpenAI(
                base_url=self.base_url,
                api_key=self.api_key or "EMPTY",
                timeout=self.timeout_s,
                max_retries=0,
            )
        return self._client

    def verify(self, expected: ExpectedModel, model: str | None) -> str:
        """The served model id to use, once the server is shown to serve the target."""
        try:
            return verify_server(
                self.base_url, self.api_key, expected, model=model, where="data.server.base_url"
            )
        except ServerUnreachable as exc:
            raise ServerUnavailable(f"{exc}; is the server up?") from None

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
            model=self.model,
            messages=messages,
            max_tokens=self.max_new_tokens,
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

    def generate(self, requests: list[Request], on_result: OnResult) -> None:
        """``concurrency`` requests in flight; each result is handed over in this thread
        as it completes (the cache is written by one thread only)."""
        pool = ThreadPoolExecutor(max_workers=self.concurrency)
        try:
            futures = {pool.submit(self.request, r.messages): k for k, r in enumerate(requests)}
            for fut in as_completed(futures):
                on_result(futures[fut], fut.result())
        finally:  # on Ctrl-C, drop the queued requests rather than send them all first
            pool.shutdown(wait=True, cancel_futures=True)


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


@contextlib.contextmanager
def managed_server(
    engine: Any,
    python: str | Path,
    base_url: str,
    startup_timeout_s: float,
    shutdown_timeout_s: float,
    log_path: Path,
) -> Iterator[VllmServer]:
    """Serve ``engine`` (an :class:`~eagle3_pipeline.serving.engine.Engine`) with the vLLM
    environment's ``python`` at ``base_url``'s port, wait until ``base_url/models``
    answers, and ALWAYS stop it (its whole process group: vLLM forks workers) when the
    block exits. Failing to start raises ``ServerUnavailable``, which the stage reports.
    The server's ``api_key`` is what the client must send."""
    url = urlparse(base_url)
    server = engine_server(
        engine,
        python,
        url.port or 8000,
        log_path,
        startup_timeout_s,
        shutdown_timeout_s,
        port_key="data.server.port",
        health_path=url.path.rstrip("/") + "/models",
        error=ServerUnavailable,
    )
    with server:
        yield server
