"""On-policy regeneration: the hf backend against direct ``generate`` calls, and the server
backend against a real HTTP server on localhost serving the tiny target (with faults)."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from eagle3_pipeline.core.corpus import builtin_conversations
from eagle3_pipeline.core.errors import ConfigError
from eagle3_pipeline.data.conversation import Conversation, Message, normalize_record
from eagle3_pipeline.data.regenerate.turns import (
    Generation,
    GenerationCache,
    ReasoningMarkers,
    plan_turns,
    regenerate_rows,
)
from eagle3_pipeline.data.regenerate.hf import HFBackend
from eagle3_pipeline.data.regenerate.server import ServerBackend, ServerUnavailable
from eagle3_pipeline.data.rows import end_of_turn_ids, load_tokenizer
from eagle3_pipeline.data.view import PrepareInputs
from eagle3_pipeline.serving.identity import ExpectedModel, ServerIdentityError, expected_model
from eagle3_pipeline.targets.chat import render_ids
from eagle3_pipeline.targets.tiny import REASONING_MARKERS, load_target_model

REPO = Path(__file__).resolve().parents[2]
MAX_NEW = 24
THINK = REASONING_MARKERS  # the tiny target's (its chat format's) reasoning markers


@pytest.fixture(scope="module")
def target(tiny_target):
    model_dir = tiny_target / "data/target/model"
    tok = load_tokenizer(model_dir)
    return model_dir, tok, end_of_turn_ids(tok, model_dir), load_target_model(model_dir)


@pytest.fixture(scope="module")
def convs() -> list[Conversation]:
    """Single- and two-turn builtin conversations, plus one of user turns only."""
    allc = [normalize_record(c, f"builtin[{i}]") for i, c in enumerate(builtin_conversations(0))]
    two = [c for c in allc if len(c.messages) == 4][:3]
    one = [c for c in allc if len(c.messages) == 2][:3]
    prompt_only = Conversation("q", (Message("user", "Tell me about lists."),))
    return [*two, *one, prompt_only]


def _hf(target, batch_size=4) -> HFBackend:
    model_dir, tok, eot, model = target
    return HFBackend(model_dir, eot, tok.pad_token_id, MAX_NEW, batch_size, model=model)


def _direct_greedy(model, ids: list[int], eot: list[int]) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([ids]),
            max_new_tokens=MAX_NEW,
            do_sample=False,
            eos_token_id=eot,
        )
    gen = out[0, len(ids) :].tolist()
    return gen[: gen.index(eot[0]) + 1] if eot[0] in gen else gen


@pytest.fixture(scope="module")
def hf_rows(target, convs):
    _, tok, eot, _ = target
    return regenerate_rows(convs, _hf(target), tok, eot, 512, progress=False, markers=THINK)


def test_hf_rows_are_the_targets_own_greedy_continuation(target, convs, hf_rows):
    _, tok, eot, model = target
    rows, stats = hf_rows
    assert len(rows) == 3 * 2 + 3 + 1 and stats.requests == len(rows) and not stats.errors
    for r in rows:
        assert r.completion == _direct_greedy(model, r.context, eot), r.conversation
    # turn 2's context is the template's render of the history with the target's own
    # first answer in it (reasoning dropped as at inference), then the original user turn
    by_conv: dict[str, list] = {}
    for r in rows:
        by_conv.setdefault(r.conversation, []).append(r)
    think = ReasoningMarkers(tok, markers=THINK)
    for c in convs[:3]:
        first, second = by_conv[c.id]
        msgs = c.chat()
        history = [msgs[0], think.message(first.completion, eot), msgs[2]]
        assert second.context == render_ids(tok, history, generation_prompt=True)
        assert c.messages[1].content not in tok.decode(second.context)


def test_hf_batching_does_not_change_the_tokens(target, convs, hf_rows):
    _, tok, eot, _ = target
    rows1, _ = regenerate_rows(
        convs[:2], _hf(target, batch_size=1), tok, eot, 512, progress=False, markers=THINK
    )
    assert [(r.context, r.completion) for r in rows1] == [
        (r.context, r.completion) for r in hf_rows[0][:4]
    ]


def test_cache_resumes_without_generating_again(target, convs, hf_rows, tmp_path):
    _, tok, eot, _ = target
    cache = GenerationCache(tmp_path / "c.jsonl")
    regenerate_rows(
        convs[:2], _hf(target), tok, eot, 512, cache=cache, progress=False, markers=THINK
    )
    with open(tmp_path / "c.jsonl", "a") as fh:
        fh.write('{"key": "torn')  # a crash mid-write
    again = GenerationCache(tmp_path / "c.jsonl")
    rows, stats = regenerate_rows(
        convs, _hf(target), tok, eot, 512, cache=again, progress=False, markers=THINK
    )
    # 4 turns cached by the first run (more when conversations ask the same question)
    assert stats.cached >= 4 and stats.requests == len(rows) - stats.cached
    assert [r.completion for r in rows] == [r.completion for r in hf_rows[0]]


class _StopsAfter:
    """The real target, whose ``generate`` is interrupted (Ctrl-C) after ``calls`` batches."""

    def __init__(self, model: Any, calls: int) -> None:
        self.model, self.calls = model, calls

    def generate(self, **kw: Any) -> Any:
        if self.calls == 0:
            raise KeyboardInterrupt
        self.calls -= 1
        return self.model.generate(**kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def test_an_interrupted_round_keeps_the_batches_it_finished(target, convs, hf_rows, tmp_path):
    model_dir, tok, eot, model = target

    def run(backend: HFBackend):
        cache = GenerationCache(tmp_path / "c.jsonl")
        return regenerate_rows(
            convs, backend, tok, eot, 512, cache=cache, progress=False, markers=THINK
        )

    stops = _StopsAfter(model, 1)
    with pytest.raises(KeyboardInterrupt):
        run(HFBackend(model_dir, eot, tok.pad_token_id, MAX_NEW, 2, model=stops))
    # the first batch of round 0 (two requests) was written before the interrupt
    assert len(GenerationCache(tmp_path / "c.jsonl").entries) == 2
    rows, stats = run(_hf(target))
    assert stats.cached == 2 and stats.requests == len(rows) - 2
    assert [r.completion for r in rows] == [r.completion for r in hf_rows[0]]


def test_reasoning_drop_cuts_between_the_markers_at_token_level(target):
    _, tok, eot, _ = target
    ids = tok("<think>so I think</think>Answer.<|im_end|>", add_special_tokens=False)["input_ids"]
    cut = ReasoningMarkers(tok, "drop", markers=THINK).supervised(ids)
    assert tok.decode(cut) == "<think></think>Answer.<|im_end|>"
    assert ReasoningMarkers(tok, "keep", markers=THINK).supervised(ids) == ids
    msg = ReasoningMarkers(tok, markers=THINK).message(ids, eot)
    assert msg == {"role": "assistant", "content": "Answer.", "reasoning_content": "so I think"}


def test_a_family_without_reasoning_markers_keeps_the_text_and_cannot_drop(target):
    _, tok, eot, _ = target
    ids = tok("<think>so I think</think>Answer.<|im_end|>", add_special_tokens=False)["input_ids"]
    none = ReasoningMarkers(tok, markers=())
    assert none.supervised(ids) == ids
    assert none.message(ids, eot) == {
        "role": "assistant",
        "content": "<think>so I think</think>Answer.",
    }
    with pytest.raises(ConfigError, match="its family .* declares none"):
        ReasoningMarkers(tok, "drop", markers=())
    with pytest.raises(ConfigError, match="needs <a> and </a> as single tokens"):
        ReasoningMarkers(tok, "drop", markers=("<a>", "</a>"))


def test_plan_turns_regenerates_after_each_user_segment():
    lead, segs = plan_turns(
        Conversation(
            "p",
            (
                Message("assistant", "Hello, I am a bot."),
                Message("user", "a"),
                Message("assistant", "x"),
                Message("user", "b"),
            ),
        )
    )
    assert lead == [{"role": "assistant", "content": "Hello, I am a bot."}]
    assert segs == [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]


# --------------------------------------------------------------------------- server backend


class ChatServer:
    """The tiny target behind /v1/models, /tokenize and /v1/chat/completions
    (``return_token_ids`` as vLLM answers it; an API key on /v1 when ``api_key``), with
    faults chosen by a word in the last user message: FAIL500 (always 500), FLAKY (503 on
    the first attempt), SLOW (sleeps past the client's timeout), NOIDS (a response without
    token ids), BADREQ (400, not retried).

    It renders each chat itself, as vLLM's chat endpoint does and with none of our code:
    the tokenizer's chat template (``chat_template``: a server started with another) to
    text, then encoded with the request's ``add_special_tokens`` (vLLM's default False)."""

    def __init__(
        self,
        model_dir: Path,
        tok,
        eot,
        model,
        api_key: str | None = None,
        chat_template: str | None = None,
    ) -> None:
        self.tok, self.eot, self.model = tok, eot, model
        self.model_dir, self.api_key = model_dir, api_key
        self.chat_template = chat_template
        self.lock = threading.Lock()
        self.attempts: Counter[str] = Counter()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, obj: Any) -> None:
                body = json.dumps(obj).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _authorized(self) -> bool:
                if server.api_key is None or not self.path.startswith("/v1"):
                    return True
                if self.headers.get("Authorization") == f"Bearer {server.api_key}":
                    return True
                self._send(401, {"error": "Unauthorized"})
                return False

            def do_GET(self) -> None:
                if not self._authorized():
                    return
                if self.path == "/v1/models":
                    self._send(
                        200,
                        {
                            "object": "list",
                            "data": [{"id": "tiny-kimi", "root": str(server.model_dir)}],
                        },
                    )
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if not self._authorized():
                    return
                if self.path == "/tokenize":
                    ids = server.tok(req["prompt"], add_special_tokens=req["add_special_tokens"])
                    self._send(200, {"tokens": ids["input_ids"]})
                    return
                code, obj = server.answer(req)
                self._send(code, obj)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def render(self, req: dict[str, Any]) -> list[int]:
        text = self.tok.apply_chat_template(
            req["messages"],
            chat_template=self.chat_template,
            tokenize=False,
            add_generation_prompt=req.get("add_generation_prompt", True),
        )
        return list(self.tok.encode(text, add_special_tokens=req.get("add_special_tokens", False)))

    def answer(self, req: dict[str, Any]) -> tuple[int, Any]:
        import torch

        last = req["messages"][-1]["content"]
        with self.lock:
            self.attempts[last] += 1
            n = self.attempts[last]
        if "FAIL500" in last:
            return 500, {"error": "boom"}
        if "BADREQ" in last:
            return 400, {"error": "bad request"}
        if "FLAKY" in last and n == 1:
            return 503, {"error": "try again"}
        if "SLOW" in last:
            time.sleep(3.0)
        if not req.get("return_token_ids"):
            return 400, {"error": "this fixture only serves return_token_ids requests"}
        prompt = self.render(req)
        with self.lock, torch.no_grad():
            out = self.model.generate(
                input_ids=torch.tensor([prompt]),
                max_new_tokens=req["max_tokens"],
                do_sample=False,
                eos_token_id=self.eot,
            )
        gen = out[0, len(prompt) :].tolist()
        stopped = self.eot[0] in gen
        gen = gen[: gen.index(self.eot[0]) + 1] if stopped else gen
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": self.tok.decode(gen)},
            "finish_reason": "stop" if stopped else "length",
            "token_ids": gen,
        }
        if "NOIDS" in last:
            return 200, {"choices": [{k: v for k, v in choice.items() if k != "token_ids"}]}
        return 200, {
            "id": "x",
            "object": "chat.completion",
            "model": req["model"],
            "prompt_token_ids": prompt,
            "choices": [choice],
        }

    def __enter__(self) -> ChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def server(target):
    model_dir, tok, eot, model = target
    with ChatServer(model_dir, tok, eot, model) as s:
        yield s


def _expected(target) -> Any:
    model_dir, tok, _, _ = target
    return expected_model(f"tiny kimi ({model_dir})", ("tiny-kimi-k25", model_dir), tok)


def _user(content: str, cid: str) -> Conversation:
    return Conversation(cid, (Message("user", content),))


def test_server_rows_equal_the_hf_rows_token_for_token(target, convs, hf_rows, server):
    _, tok, eot, _ = target
    backend = ServerBackend(
        server.url, MAX_NEW, expected=_expected(target), concurrency=3, timeout_s=30, backoff_s=0.01
    )
    assert backend.model == "tiny-kimi"  # found in /v1/models by its path
    rows, stats = regenerate_rows(convs, backend, tok, eot, 512, progress=False, markers=THINK)
    assert not stats.errors and stats.prompt_mismatch == 0
    assert [(r.conversation, r.context, r.completion) for r in rows] == [
        (r.conversation, r.context, r.completion) for r in hf_rows[0]
    ]


def test_a_render_that_differs_from_the_servers_is_counted(target, convs, server, monkeypatch):
    """The server conditions on its own render of the messages. Ours differing from it is
    counted on every request -- whether ours is wrong or the server was started with
    another chat template -- and the rows hold the ids the server conditioned on."""
    from eagle3_pipeline.data.regenerate import turns as regenerate

    model_dir, tok, eot, model = target
    single = convs[3:6]  # one request each
    ours = regenerate.render_ids
    with monkeypatch.context() as m:  # our render without the generation prompt: wrong
        m.setattr(
            regenerate,
            "render_ids",
            lambda t, msgs, generation_prompt: ours(t, msgs, generation_prompt=False),
        )
        backend = ServerBackend(server.url, MAX_NEW, expected=_expected(target), timeout_s=30)
        _, stats = regenerate_rows(single, backend, tok, eot, 512, progress=False, markers=THINK)
    assert not stats.errors and stats.requests == 3 and stats.prompt_mismatch == 3

    other = "{{- 'Served with another template.' -}}\n" + tok.chat_template
    with ChatServer(model_dir, tok, eot, model, chat_template=other) as served:
        backend = ServerBackend(served.url, MAX_NEW, expected=_expected(target), timeout_s=30)
        rows, stats = regenerate_rows(single, backend, tok, eot, 512, progress=False, markers=THINK)
    assert not stats.errors and stats.requests == 3 and stats.prompt_mismatch == 3
    for row, conv in zip(rows, single, strict=True):
        text = tok.apply_chat_template(
            conv.chat()[:1], chat_template=other, tokenize=False, add_generation_prompt=True
        )
        assert text.startswith("Served with another template.")
        assert row.context == tok.encode(text, add_special_tokens=False)


def test_server_failures_are_counted_never_empty_answers(target, convs, server):
    _, tok, eot, _ = target
    bad = [
        _user("FAIL500 What is a list?", "fail"),
        _user("SLOW What is a dict?", "slow"),
        _user("FLAKY What is a set?", "flaky"),
        _user("NOIDS What is a tuple?", "noids"),
        _user("BADREQ What is a str?", "badreq"),
        Conversation(
            "second-fails",
            (
                Message("user", "What is an int?"),
                Message("assistant", "x"),
                Message("user", "FAIL500 and a float?"),
            ),
        ),
    ]
    backend = ServerBackend(
        server.url,
        MAX_NEW,
        expected=_expected(target),
        concurrency=4,
        timeout_s=1.0,
        retries=1,
        backoff_s=0.01,
    )
    rows, stats = regenerate_rows(
        [*bad, convs[3]], backend, tok, eot, 512, progress=False, markers=THINK
    )
    assert dict(stats.errors) == {
        "regenerate_http_500": 2,
        "regenerate_timeout": 1,
        "regenerate_no_token_ids": 1,
        "regenerate_http_400": 1,
    }
    assert server.attempts["FAIL500 What is a list?"] == 2  # retried once, then counted
    assert server.attempts["BADREQ What is a str?"] == 1  # a 4xx is not retried
    got = Counter(r.conversation for r in rows)
    assert got == {"flaky": 1, "second-fails": 1, convs[3].id: 1}
    assert all(r.completion for r in rows)


def test_unreachable_server_is_a_clear_error(target):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ServerUnavailable, match=f"127.0.0.1:{port}.*is the server up"):
        ServerBackend(f"http://127.0.0.1:{port}/v1", 8, expected=_expected(target), timeout_s=2)


def test_a_server_serving_another_model_is_refused(target, server):
    """A server at base_url that serves something else (another vLLM on the default
    port) never produces training data: wrong names, or the right name with another
    tokenizer, are refused naming both models."""
    model_dir, tok, _, _ = target
    other = expected_model("tiny llama (/models/llama)", ("tiny-llama", "/models/llama"), tok)
    with pytest.raises(
        ServerIdentityError,
        match=r"serves tiny-kimi \(.*\), not the target "
        r"tiny llama \(/models/llama\)",
    ):
        ServerBackend(server.url, 8, expected=other)
    with pytest.raises(ServerIdentityError, match="does not serve a model named 'llama'"):
        ServerBackend(server.url, 8, expected=_expected(target), model="llama")
    # the tiny targets share one tokenizer, so another tokenizer's ids are made up here
    ids = expected_model("", (), tok).probe_ids
    assert ids is not None
    same_name = ExpectedModel("tiny kimi", ("tiny-kimi",), tuple(reversed(ids)))
    with pytest.raises(
        ServerIdentityError, match="tiny-kimi tokenizes differently from the target tiny kimi"
    ):
        ServerBackend(server.url, 8, expected=same_name)


def test_the_api_key_of_a_users_server_is_sent(target):
    """A key-protected server: requests carry the key from ``data.server.api_key_env``;
    without it the refusal says the key was rejected."""
    model_dir, tok, eot, model = target
    with ChatServer(model_dir, tok, eot, model, api_key="s3cret") as keyed:
        with pytest.raises(ServerIdentityError, match="HTTP 401.*rejects this run's API key"):
            ServerBackend(keyed.url, 8, expected=_expected(target))
        backend = ServerBackend(
            keyed.url, MAX_NEW, expected=_expected(target), api_key="s3cret", timeout_s=30
        )
        assert backend.model == "tiny-kimi"
        out = backend.request([{"role": "user", "content": "What is a list?"}])
        assert isinstance(out, Generation) and out.token_ids, out


# --------------------------------------------------------------------------- the stage


def test_stage_regenerates_through_the_server_backend(tiny_target, server, tmp_path, monkeypatch):
    from datasets import load_from_disk

    from eagle3_pipeline.core.config import load_config
    from eagle3_pipeline.data.prepare import prepare, prepared_dir

    shutil.copytree(REPO / "conf", tmp_path / "conf")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "target").symlink_to(tiny_target / "data" / "target")
    monkeypatch.chdir(tmp_path)
    common = ["train.samples=4", "data.heldout_size=2", f"data.max_new_tokens={MAX_NEW}"]
    cfg = load_config(
        [*common, "data.regenerate_backend=server", f"data.server.base_url={server.url}"]
    )
    m = prepare(PrepareInputs.from_config(cfg), progress=False)
    assert m.regenerate is True and m.backend == "server" and m.errors == {}
    assert m.regeneration is not None and m.regeneration.requests == m.rows >= 4
    server_rows = load_from_disk(str(prepared_dir(PrepareInputs.from_config(cfg)))).with_format(
        None
    )[:]
    m2 = prepare(
        PrepareInputs.from_config(load_config(common)), progress=False
    )  # hf: a separate cache, same tokens
    assert m2.backend == "hf" and m2.regeneration is not None and m2.regeneration.cached == 0
    assert (
        load_from_disk(str(prepared_dir(PrepareInputs.from_config(cfg)))).with_format(None)[:]
        == server_rows
    )
