"""What a rerun of `extract` reuses when the prepared rows changed (issue 37).

A file is reused only when the manifest proves it holds the current row's states (its
per-file row hash); any other file is a mismatch, whatever the counts: discarded and
redone with ``extract.on_mismatch=restart`` (one warning line), refused with ``refuse``
(one error line naming the setting to change). Which files were reused and which redone
is read off the files themselves: every file of the first run is stamped with an old
mtime, so a reused file keeps it and a redone one does not, and a redone file's
``token_ids`` are the new row's.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
from extract_work import extract, make_rows, rows_of, workdir_for
from safetensors import safe_open

from eagle3_pipeline.core.errors import StageError

N = 8  # rows of the first run
OUT = "data/hidden_states"
STAMP_NS = 1_000_000_000_000_000_000  # 2001-09-09: the first run's files, stamped
LOGGER = "eagle3_pipeline.extract"


@pytest.fixture(scope="module")
def first_run(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished default run over 8 rows of the tiny Kimi-K2.5; tests work on copies."""
    wd = workdir_for(tiny_target, tmp_path_factory.mktemp("reuse_first"), n=N)
    assert extract(wd).samples_written == N
    return wd


@pytest.fixture
def wd(first_run: Path, tiny_target: Path, tmp_path: Path) -> Path:
    """A copy of the first run, its hidden-state files stamped with an old mtime."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data/target").symlink_to(tiny_target / "data/target")
    for sub in ("prepared", "hidden_states"):
        shutil.copytree(first_run / "data" / sub, tmp_path / "data" / sub)
    for f in (tmp_path / OUT).glob("hs_*.safetensors"):
        os.utime(f, ns=(STAMP_NS, STAMP_NS))
    return tmp_path


def write_rows(wd: Path, rows: list[list[int]]) -> None:
    """Prepared rows with exactly these input_ids (what prepare makes of a data file)."""
    from datasets import Dataset

    shutil.rmtree(wd / "data/prepared")
    Dataset.from_dict(
        {
            "input_ids": rows,
            "loss_mask": [[1] * len(r) for r in rows],
            "seq_len": [len(r) for r in rows],
        }
    ).save_to_disk(str(wd / "data/prepared"))


def state(wd: Path) -> tuple[set[int], set[int]]:
    """(reused, redone): the files still stamped by the first run, and the others."""
    files = {int(f.stem[3:]): f for f in (wd / OUT).glob("hs_*.safetensors")}
    reused = {i for i, f in files.items() if f.stat().st_mtime_ns == STAMP_NS}
    return reused, set(files) - reused


def assert_files_hold_rows(wd: Path) -> None:
    """Every current row's file holds that row's token ids (speculators drops any other)."""
    for i, ids in enumerate(rows_of(wd)):
        with safe_open(str(wd / OUT / f"hs_{i}.safetensors"), framework="numpy") as fh:
            assert fh.get_tensor("token_ids").tolist() == ids, i


def drop_row_hashes(wd: Path) -> None:
    """Make the manifest one written before per-file row hashes."""
    path = wd / OUT / "manifest.json"
    data = json.loads(path.read_text())
    del data["row_sha256"]
    path.write_text(json.dumps(data))


def refusal(why: str) -> str:
    return (
        f"{OUT}: existing hidden states do not match this extraction ({why}); "
        f"files are never mixed: remove {OUT} or set extract.on_mismatch=restart"
    )


def discard_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "discarding" in r.getMessage()]


# ------------------------------------------------------------------ larger, different


def test_fewer_other_rows_are_redone_under_restart(wd, caplog):
    """The issue's case: a finished default run, then fewer and different rows (another
    corpus, a data file that lost and changed conversations)."""
    make_rows(wd, 5, offset=10)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        rec = extract(wd)  # extract.on_mismatch=restart by default
    assert (rec.samples_written, rec.samples_reused) == (5, 0)
    reused, redone = state(wd)
    # rows 0..4 redone; files 5..7 of the first rows are not this run's, kept provable
    assert redone == {0, 1, 2, 3, 4} and reused == {5, 6, 7}
    assert_files_hold_rows(wd)
    assert discard_lines(caplog) == [
        f"{OUT}: discarding 5 of 8 hidden-state files, redone (extract.on_mismatch=restart): "
        f"rows 0..4 differ from the rows their files hold, per manifest.json's row_sha256"
    ]
    # the first rows back: the files kept past the end are reused, rows 0..4 redone again
    make_rows(wd, N)
    for i in range(5):
        os.utime(wd / OUT / f"hs_{i}.safetensors", ns=(STAMP_NS, STAMP_NS))
    back = extract(wd)
    assert (back.samples_written, back.samples_reused) == (5, 3)
    assert state(wd) == ({5, 6, 7}, {0, 1, 2, 3, 4})
    assert_files_hold_rows(wd)


def test_fewer_other_rows_are_refused_under_refuse_naming_the_setting(wd):
    make_rows(wd, 5, offset=10)
    with pytest.raises(StageError) as exc:
        extract(wd, "extract.on_mismatch=refuse")
    assert str(exc.value) == refusal(
        "rows 0..4 differ from the rows their files hold, per manifest.json's row_sha256"
    )
    assert state(wd) == (set(range(N)), set())  # nothing touched


def test_removed_and_edited_rows_reuse_only_what_is_proven(wd, caplog):
    """A data file that lost conversation 2 and had conversation 5 (now row 4) edited."""
    old = rows_of(wd)
    edited = [*old[4][:-1], old[4][-1] ^ 1]
    write_rows(wd, [old[0], old[1], old[3], edited, *old[5:]])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        rec = extract(wd)
    assert (rec.samples_written, rec.samples_reused) == (5, 2)
    assert state(wd) == ({0, 1, 7}, {2, 3, 4, 5, 6})
    assert_files_hold_rows(wd)
    assert discard_lines(caplog) == [
        f"{OUT}: discarding 5 of 8 hidden-state files, redone (extract.on_mismatch=restart): "
        f"rows 2..6 differ from the rows their files hold, per manifest.json's row_sha256"
    ]


# ------------------------------------------------------------------ larger, a prefix


@pytest.mark.parametrize("on_mismatch", ["restart", "refuse"])
def test_a_true_prefix_reuses_its_files(wd, caplog, on_mismatch):
    make_rows(wd, 5)  # the first 5 of the 8 rows
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        rec = extract(wd, f"extract.on_mismatch={on_mismatch}")
    assert (rec.samples_written, rec.samples_reused) == (0, 5)
    assert state(wd) == (set(range(N)), set())
    assert not discard_lines(caplog)
    make_rows(wd, N)  # and back: the files past the prefix are still proven
    again = extract(wd, f"extract.on_mismatch={on_mismatch}")
    assert (again.samples_written, again.samples_reused) == (0, N)
    assert state(wd) == (set(range(N)), set())


def test_a_prefix_an_old_manifest_cannot_prove_is_redone(wd, caplog):
    drop_row_hashes(wd)
    make_rows(wd, 5)
    why = (
        "5 rows, fewer than the 8 the files were extracted from, and manifest.json has "
        "no row_sha256 to prove them a prefix of those"
    )
    with pytest.raises(StageError) as exc:
        extract(wd, "extract.on_mismatch=refuse")
    assert str(exc.value) == refusal(why)
    assert state(wd) == (set(range(N)), set())
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        rec = extract(wd)
    assert (rec.samples_written, rec.samples_reused) == (5, 0)
    assert state(wd) == (set(), set(range(5)))  # all 8 discarded, the 5 redone
    assert_files_hold_rows(wd)
    assert discard_lines(caplog) == [
        f"{OUT}: discarding 8 of 8 hidden-state files, redone (extract.on_mismatch=restart): {why}"
    ]


def test_files_whose_token_ids_are_not_their_rows_are_caught_on_a_shrink(wd, caplog):
    """A manifest that does not describe its files (a file copied in by hand)."""
    shutil.copy2(wd / OUT / "hs_2.safetensors", wd / OUT / "hs_1.safetensors")
    make_rows(wd, 5)
    with pytest.raises(StageError) as exc:
        extract(wd, "extract.on_mismatch=refuse")
    assert str(exc.value) == (
        f"{OUT}/hs_1.safetensors: token_ids differ from row 1 of data/prepared although "
        f"manifest.json records that row: the files come from other rows; remove them or "
        f"set extract.on_mismatch=restart"
    )
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        rec = extract(wd)
    assert (rec.samples_written, rec.samples_reused) == (1, 4)
    assert state(wd)[1] == {1}
    assert_files_hold_rows(wd)
    assert discard_lines(caplog) == [
        f"{OUT}: discarding 1 of 8 hidden-state files, redone (extract.on_mismatch=restart): "
        f"the token_ids of files 1 differ from their rows of data/prepared"
    ]


# ------------------------------------------------------------------ smaller, an extension


@pytest.mark.parametrize("old_manifest", [False, True], ids=["row_sha256", "old_manifest"])
@pytest.mark.parametrize("on_mismatch", ["restart", "refuse"])
def test_an_extension_reuses_every_old_file(wd, caplog, on_mismatch, old_manifest):
    if old_manifest:  # an extension is still proven by the prefix hash
        drop_row_hashes(wd)
    make_rows(wd, N + 2)  # the 8 rows, then 2 more
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        rec = extract(wd, f"extract.on_mismatch={on_mismatch}")
    assert (rec.samples_written, rec.samples_reused) == (2, N)
    assert state(wd) == (set(range(N)), {8, 9})
    assert_files_hold_rows(wd)
    assert not discard_lines(caplog)
    assert len(json.loads((wd / OUT / "manifest.json").read_text())["row_sha256"]) == N + 2


def test_an_old_manifest_does_not_vouch_for_files_past_its_rows(wd, caplog):
    """Files past the rows an old manifest records (left by an earlier shrink) are not
    these rows' states: an extension over them redoes them."""
    make_rows(wd, 5)
    assert extract(wd).samples_written == 0
    drop_row_hashes(wd)  # as if that shrink ran before per-file row hashes
    old = rows_of(wd)
    write_rows(wd, [*old, [5, 6, 7], [8, 9], [10, 11, 12]])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        rec = extract(wd)
    assert (rec.samples_written, rec.samples_reused) == (3, 5)
    assert state(wd) == (set(range(5)), {5, 6, 7})
    assert_files_hold_rows(wd)
    assert discard_lines(caplog) == [
        f"{OUT}: discarding 3 of 8 hidden-state files, redone (extract.on_mismatch=restart): "
        f"files 5..7 lie beyond the 5 rows manifest.json records"
    ]
