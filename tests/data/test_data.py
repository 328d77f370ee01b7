"""The `prepare` stage without regeneration: loading, bad input, selection, rows, outputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eagle3_pipeline.core.config import ConfigError, DataConfig, load_config
from eagle3_pipeline.data.bad_input import ErrorLog, StageInputError
from eagle3_pipeline.data.conversation import (
    Message,
    load_conversations,
    normalize_record,
    select,
)
from eagle3_pipeline.data.json_records import read_records
from eagle3_pipeline.data.rows import (
    end_of_turn_ids,
    finalize_rows,
    load_tokenizer,
    recorded_rows,
    token_frequencies,
    write_prepared,
)
from eagle3_pipeline.targets.chat import render_ids
from eagle3_pipeline.targets.tiny import END_OF_TURN

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"
REPO = Path(__file__).resolve().parents[2]

CONV_RECORD = {
    "id": "multi",
    "messages": [
        {"role": "system", "content": "You answer questions about Python."},
        {"role": "user", "content": "What is a list?"},
        {
            "role": "assistant",
            "content": "A list is an ordered, mutable sequence.",
            "reasoning_content": "The user asks about lists.",
        },
        {"role": "user", "content": "And a tuple?"},
        {
            "role": "assistant",
            "content": "A tuple is an immutable sequence.",
            "reasoning_content": "Now tuples. Compare with lists.",
        },
    ],
}
CONV = normalize_record(CONV_RECORD, "CONV")


@pytest.fixture(scope="module")
def tok(tiny_target):
    return load_tokenizer(tiny_target / "data/target/model")


@pytest.fixture(scope="module")
def eot(tok, tiny_target):
    return end_of_turn_ids(tok, tiny_target / "data/target/model")


@pytest.fixture
def workdir(tiny_target, tmp_path, monkeypatch):
    """A fresh working directory sharing the session's tiny target (data/target)."""
    shutil.copytree(REPO / "conf", tmp_path / "conf")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "target").symlink_to(tiny_target / "data" / "target")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _cfg(*overrides: str):
    return load_config(list(overrides))


# --------------------------------------------------------------------------- rows


@pytest.mark.parametrize("reasoning", ["keep", "drop"])
def test_each_row_is_the_inference_context_then_exactly_that_turn(tok, eot, reasoning):
    rows, errors = recorded_rows(CONV, tok, eot, reasoning)
    assert not errors and [r.turn for r in rows] == [2, 4]
    assert eot == [tok.convert_tokens_to_ids(END_OF_TURN)]
    for r in rows:
        msgs = CONV.chat()
        turn = msgs[r.turn]
        # the context is what the template renders for inference at this turn
        assert r.context == render_ids(tok, msgs[: r.turn], generation_prompt=True)
        text = tok.apply_chat_template(msgs[: r.turn], tokenize=False, add_generation_prompt=True)
        assert tok.decode(r.context) == text
        # the supervised span is that turn, reasoning as configured, then end-of-turn
        think = turn["reasoning_content"] if reasoning == "keep" else ""
        expected = f"<think>{think}</think>{turn['content']}{END_OF_TURN}"
        assert tok.decode(r.completion) == expected
        assert r.completion[-1] == eot[0]
    # the second row's context carries the first answer with its reasoning dropped
    ctx2 = tok.decode(rows[1].context)
    assert "<think></think>A list is an ordered" in ctx2
    assert "The user asks about lists." not in ctx2

    out, dropped, truncated = finalize_rows(rows, max_seq_len=512)
    assert not dropped and truncated == 0
    for row, r in zip(out, rows, strict=True):
        assert row["input_ids"] == r.context + r.completion
        assert row["loss_mask"] == [0] * len(r.context) + [1] * len(r.completion)


def test_truncation_keeps_partial_rows_and_drops_unsupervised_ones(tok, eot):
    rows, _ = recorded_rows(CONV, tok, eot, "keep")
    cut = len(rows[0].context) + 2  # row 0 keeps 2 supervised tokens; row 1's context is longer
    out, dropped, truncated = finalize_rows(rows, max_seq_len=cut)
    assert len(out) == 1 and sum(out[0]["loss_mask"]) == 2 and len(out[0]["input_ids"]) == cut
    assert dropped == {"no_supervised_tokens": 1} and truncated == 1


def test_a_template_that_is_not_prefix_stable_is_a_counted_row_error(tiny_target, eot):
    tok = load_tokenizer(tiny_target / "data/target/model")
    # the generation prompt says "ASSISTANT" while a rendered turn says "assistant"
    tok.chat_template = tok.chat_template.replace(
        "{%- if add_generation_prompt -%}<|im_assistant|>assistant",
        "{%- if add_generation_prompt -%}<|im_assistant|>ASSISTANT",
    )
    rows, errors = recorded_rows(CONV, tok, eot, "keep")
    assert rows == [] and errors == {"prefix_unstable": 2}


def test_written_dataset_has_speculators_columns_and_dtypes(tok, eot, tmp_path):
    import torch
    from datasets import load_from_disk

    rows, _ = recorded_rows(CONV, tok, eot, "keep")
    out, _, _ = finalize_rows(rows, 512)
    freq = write_prepared(out, tmp_path / "prepared")
    ds = load_from_disk(str(tmp_path / "prepared"))
    assert ds.column_names == ["input_ids", "loss_mask", "seq_len"] and len(ds) == 2
    assert {
        k: str(v.feature.dtype if hasattr(v, "feature") else v.dtype)
        for k, v in ds.features.items()
    } == {
        "input_ids": "int64",
        "loss_mask": "int64",
        "seq_len": "int64",
    }
    item = ds[1]  # torch format, as speculators' loader compares with torch.equal
    assert item["input_ids"].dtype == torch.int64 and item["loss_mask"].dtype == torch.int64
    assert item["input_ids"].tolist() == out[1]["input_ids"]
    assert int(item["seq_len"]) == len(out[1]["input_ids"])
    saved = torch.load(tmp_path / "prepared" / "token_freq.pt", weights_only=True)
    assert saved == freq == token_frequencies(out)
    assert sum(saved.values()) == sum(sum(r["loss_mask"]) for r in out)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temp dir left behind"


# --------------------------------------------------------------------------- loading


def test_sharegpt_and_openai_records_normalise_and_bad_ones_are_counted(caplog):
    data = DataConfig(source="file", path=str(FIXTURES / "mixed.jsonl"), on_error="skip")
    convs, errors, n_in = load_conversations(data, seed=0)
    assert [c.id for c in convs] == ["sg-1", "oa-1", "sg-2"]
    assert convs[0].messages[0] == Message("system", "Be brief.")
    assert [m.role for m in convs[0].messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert convs[1].messages[1].reasoning_content == "The user asks about dicts."
    assert dict(errors.counts) == {
        "malformed_json": 1,
        "non_utf8": 1,
        "unknown_role": 1,
        "empty_conversation": 1,
        "no_assistant_turn": 1,
        "non_string_content": 1,
        "blank_line": 1,
    }
    assert n_in == 10  # every line, the blank one included
    text = caplog.text
    assert f"{FIXTURES / 'mixed.jsonl'}:3: malformed JSON" in text
    assert f"{FIXTURES / 'mixed.jsonl'}:4: not UTF-8" in text
    # with regeneration, a conversation of user turns only is usable
    convs, errors, _ = load_conversations(data, seed=0, require_assistant=False)
    assert "noasst" in [c.id for c in convs] and "no_assistant_turn" not in errors.counts


def test_on_error_fail_reads_to_the_end_and_names_every_bad_line():
    data = DataConfig(source="file", path=str(FIXTURES / "mixed.jsonl"), on_error="fail")
    _, errors, _ = load_conversations(data, seed=0)  # reads everything, then decides
    assert [e.where.rsplit(":", 1)[1] for e in errors.entries] == [
        "3",
        "4",
        "5",
        "6",
        "7",
        "8",
        "9",
    ]
    with pytest.raises(
        StageInputError,
        match=r"data: 7 bad records \(blank_line 1, .*\); "
        r"first: .*mixed\.jsonl:3: malformed JSON.*listed in r\.jsonl",
    ):
        errors.raise_if_failing(Path("r.jsonl"))


def test_json_document_and_missing_file():
    data = DataConfig(source="file", path=str(FIXTURES / "openai.json"))
    convs, errors, n_in = load_conversations(data, seed=0)
    assert len(convs) == 2 and n_in == 2 and not errors.counts
    assert convs[1].id == "conv-000001"
    with pytest.raises(FileNotFoundError, match="nope.jsonl: file not found"):
        list(read_records(FIXTURES / "nope.jsonl", ErrorLog()))


def test_lone_surrogate_text_is_refused_as_non_utf8(tmp_path):
    p = tmp_path / "s.jsonl"
    p.write_text(
        '{"messages": [{"role": "user", "content": "x\\ud800"}, '
        '{"role": "assistant", "content": "y"}]}\n'
    )
    _, errors, _ = load_conversations(DataConfig(source="file", path=str(p)), seed=0)
    assert dict(errors.counts) == {"non_utf8": 1}


def test_hf_source_without_network_is_a_clear_config_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="data.source=hf.*local file"):
        load_conversations(DataConfig(source="hf", path="org/some-chat-set"), seed=0)


# --------------------------------------------------------------------------- selection


def test_heldout_is_drawn_first_and_training_sets_are_prefixes():
    items = list(range(100))
    held_a, train_a = select(items, 10, 20, seed=3)
    held_b, train_b = select(items, 10, 50, seed=3)
    assert held_a == held_b and len(held_a) == 10
    assert train_b[:20] == train_a and not set(held_a) & set(train_b)
    assert select(items, 10, 20, seed=4)[0] != held_a
    _, everything = select(items, 10, 1000, seed=3)
    assert len(everything) == 90
    with pytest.raises(ConfigError, match="heldout_size"):
        select(items[:5], 5, 1, seed=0)


# --------------------------------------------------------------------------- the stage


def test_stage_outputs_heldout_stability_and_prefix_rows(workdir):
    from datasets import load_from_disk

    from eagle3_pipeline.data.prepare import heldout_path, prepare, prepared_dir
    from eagle3_pipeline.stages.prepare import run

    base = ("data.regenerate=false",)
    run(_cfg(*base, "train.samples=12"), progress=False)
    held_12 = heldout_path(_cfg()).read_bytes()
    rows_12 = load_from_disk(str(prepared_dir(_cfg()))).with_format(None)["input_ids"]
    metrics = json.loads((workdir / "metrics/details/prepare.json").read_text())
    assert metrics["conversations_train"] == 12 and metrics["rows"] == len(rows_12) >= 12
    assert metrics["conversations_heldout"] == 16 and metrics["conversations_in"] > 800
    assert metrics["supervised_tokens"] < metrics["tokens"]
    assert metrics["max_tokens_per_row"] == max(map(len, rows_12))
    assert metrics["regenerate"] is False and metrics["backend"] is None
    assert metrics["roles"] == "any" and metrics["truncated_tail"] == 0
    assert metrics["license"] == "PSF-2.0" and "pinned" not in metrics
    assert [t["turn"] for t in metrics["turns"]] == list(range(len(metrics["turns"])))
    assert sum(t["rows"] for t in metrics["turns"]) >= metrics["rows"]

    m = prepare(_cfg(*base, "train.samples=30"), progress=False)
    rows_30 = load_from_disk(str(prepared_dir(_cfg()))).with_format(None)["input_ids"]
    assert heldout_path(_cfg()).read_bytes() == held_12  # byte-identical
    assert rows_30[: len(rows_12)] == rows_12 and m.rows > len(rows_12)
    # the held-out set is the same conversations, the training set is another one
    assert m.heldout_sha256 == metrics["heldout_sha256"]
    assert m.train_sha256 != metrics["train_sha256"] and len(str(m.train_sha256)) == 64

    held = [json.loads(line) for line in held_12.decode().splitlines()]
    assert len(held) == 16 and len({h["id"] for h in held}) == 16
    tok = load_tokenizer(workdir / "data/target/model")
    for h in held:
        assert h["messages"][-1]["role"] == "user" and h["reference"]
        assert h["prompt_ids"] == render_ids(tok, h["messages"], generation_prompt=True)


def test_stage_bad_input_fails_with_one_line_and_leaves_nothing(workdir, capsys):
    from eagle3_pipeline.stages.prepare import main

    src = str(FIXTURES / "mixed.jsonl")
    common = ["data.source=file", f"data.path={src}", "data.regenerate=false"]
    with pytest.raises(SystemExit) as exc:
        main([*common, "data.on_error=fail", "data.heldout_size=1"])
    assert exc.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: prepare:") and "mixed.jsonl:3: malformed JSON" in err
    assert "7 bad records" in err and "data/bad_lines.jsonl" in err
    assert (
        not (workdir / "data/prepared").exists()
        and not (workdir / "metrics/details/prepare.json").exists()
    )
    report = [json.loads(x) for x in (workdir / "data/bad_lines.jsonl").read_text().splitlines()]
    assert [r["where"] for r in report] == [f"{src}:{i}" for i in range(3, 10)]

    main([*common, "data.heldout_size=1"])
    metrics = json.loads((workdir / "metrics/details/prepare.json").read_text())
    assert metrics["conversations_in"] == 10 and metrics["conversations_invalid"] == 7
    assert metrics["errors"]["malformed_json"] == 1 and metrics["errors"]["non_utf8"] == 1
    assert metrics["conversations_heldout"] == 1 and metrics["conversations_train"] == 2

    with pytest.raises(SystemExit) as exc:
        main(["data.source=file", "data.path=missing.jsonl"])
    assert exc.value.code == 1
    assert "missing.jsonl: file not found" in capsys.readouterr().err


def test_every_bad_line_is_in_the_report_not_only_the_first_five(workdir, tmp_path, caplog):
    """A 100k-line file with many bad lines: each one named in data/bad_lines.jsonl (the
    non-UTF-8 and blank ones too), the log names five and says where the rest are."""
    from eagle3_pipeline.stages.prepare import main

    good = json.dumps(
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    ).encode()
    lines = (
        [good] * 4
        + [b"{broken"] * 6
        + [b"", b'{"messages": [{"role": "user", "content": "caf\xe9"}]}', good]
    )
    p = tmp_path / "many.jsonl"
    p.write_bytes(b"\n".join(lines) + b"\n")
    main(["data.source=file", f"data.path={p}", "data.regenerate=false", "data.heldout_size=1"])
    report = [json.loads(x) for x in (workdir / "data/bad_lines.jsonl").read_text().splitlines()]
    assert [(r["where"], r["reason"]) for r in report] == [
        *[(f"{p}:{i}", "malformed_json") for i in range(5, 11)],
        (f"{p}:11", "blank_line"),
        (f"{p}:12", "non_utf8"),
    ]
    assert sum("skipped:" in r.message for r in caplog.records) == 5
    assert (
        "8 bad records (blank_line 1, malformed_json 6, non_utf8 1); every one is listed"
        in caplog.text
    )


def test_an_empty_data_file_is_one_clear_line(workdir, tmp_path, capsys):
    from eagle3_pipeline.stages.prepare import main

    for name, content in (("empty.jsonl", b""), ("blank.jsonl", b"\n\n")):
        p = tmp_path / name
        p.write_bytes(content)
        with pytest.raises(SystemExit) as exc:
            main(["data.source=file", f"data.path={p}", "data.regenerate=false"])
        assert exc.value.code == 1
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert str(p) in err and "({})" not in err
        assert ("no conversation in it (empty)" if not content else "none of its 2 records") in err
