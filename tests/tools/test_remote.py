"""``eagle3-remote`` on real DVC repositories and a real local-directory remote.

A tiny graph (one stage writing a directory and a file) stands in for the pipeline's: the
faults are the remote's, not the stages'. Every DVC command is real; objects are deleted
from the remote as a cleaned share would lose them. The pipeline's own graph goes through
the same command in ``tests/pipeline/test_pipeline_dvc.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from commands import run, run_ok

pytestmark = pytest.mark.integration

STAGE = """\
stages:
  make:
    cmd: python -c "import pathlib as p; d=p.Path('out'); d.mkdir(exist_ok=True);
      (d/'a.txt').write_text('a'); (d/'b.txt').write_text('b');
      p.Path('one.txt').write_text('one'); p.Path('fig.json').write_text('{}')"
    outs:
      - out
      - one.txt
      - fig.json:
          cache: false
"""


def _remote(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run(cwd, sys.executable, "-m", "eagle3_pipeline.tools.remote.cli", *args)


def _error_line(proc: subprocess.CompletedProcess) -> str:
    """The command failed with exactly one line on stderr, and no traceback."""
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def _object(store: Path, oid: str) -> Path:
    return store / "files" / "md5" / oid[:2] / oid[2:]


@pytest.fixture
def pushed(tmp_path: Path) -> tuple[Path, Path]:
    """Clone A: the graph run, committed and pushed to a local-directory remote."""
    a, store = tmp_path / "a", tmp_path / "store"
    a.mkdir()
    run_ok(a, "git", "init", "-q")
    run_ok(a, sys.executable, "-m", "dvc", "init", "-q")
    (a / "dvc.yaml").write_text(STAGE)
    run_ok(a, sys.executable, "-m", "dvc", "repro", "-q")
    run_ok(a, sys.executable, "-m", "dvc", "remote", "add", "-d", "store", str(store))
    run_ok(a, "git", "add", "-A")
    run_ok(a, "git", "commit", "-qm", "run")
    pushed = _remote(a, "push")
    assert pushed.returncode == 0, pushed.stderr
    return a, store


def _oid(repo: Path, name: str) -> str:
    """A file's md5 as DVC stored it (the cache object's name)."""
    import hashlib

    return hashlib.md5((repo / name).read_bytes()).hexdigest()


def test_a_complete_remote_is_one_summary_line(pushed: tuple[Path, Path]) -> None:
    a, store = pushed
    proc = _remote(a, "check")
    assert proc.returncode == 0, proc.stderr
    # the directory's listing, its two files and one.txt; fig.json is not cached
    assert f"remote 'store' at {store} holds every cached output of dvc.lock: 4 objects" in (
        proc.stdout
    )


def test_a_file_lost_from_the_remote_is_named_and_pull_fetches_nothing(
    pushed: tuple[Path, Path], tmp_path: Path
) -> None:
    a, store = pushed
    lost = _object(store, _oid(a, "out/b.txt"))
    lost.unlink()
    line = _error_line(_remote(a, "check"))
    assert "remote 'store' lacks out/b.txt (output of stage 'make'" in line
    assert f"object {lost}" in line and "`eagle3-remote push`" in line  # A's cache has it

    b = tmp_path / "b"
    run_ok(tmp_path, "git", "clone", "-q", str(a), str(b))
    line = _error_line(_remote(b, "pull"))
    assert "lacks out/b.txt" in line and "`dvc repro make`" in line  # B's cache lacks it
    assert not (b / "out").exists() and not (b / "one.txt").exists()  # nothing half-pulled

    # plain `dvc push` believes the directory complete (its listing is on the remote)
    run_ok(a, sys.executable, "-m", "dvc", "push")
    assert not lost.exists()
    mended = _remote(a, "push")
    assert mended.returncode == 0, mended.stderr
    assert lost.is_file() and "sent 1 object" in mended.stderr

    pulled = _remote(b, "pull")
    assert pulled.returncode == 0, pulled.stderr
    assert (b / "out/b.txt").read_text() == "b" and (b / "one.txt").read_text() == "one"


def test_a_lost_directory_listing_and_check_all(pushed: tuple[Path, Path]) -> None:
    a, store = pushed
    (a / ".dvc" / "cache").rename(a / "cache.moved")  # this clone's cache lacks it too
    listing = next(store.rglob("*.dir"))
    listing.unlink()
    _object(store, _oid(a, "one.txt")).unlink()
    proc = _remote(a, "check", "--all")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, proc.stderr  # one per absent object, the last as the error
    assert "lacks out/ (its file listing)" in lines[0] and "`dvc repro make`" in lines[0]
    assert lines[1].startswith("error: ") and "lacks one.txt" in lines[1]
    # without --all: the first, and how many more
    assert "(and 1 more of" in _error_line(_remote(a, "check"))


def test_an_unreachable_remote_is_one_line_naming_its_path(
    pushed: tuple[Path, Path], tmp_path: Path
) -> None:
    a, store = pushed
    store.rename(tmp_path / "unmounted")
    for cmd in ("check", "pull"):
        line = _error_line(_remote(a, cmd))
        assert f"remote 'store' at {store} is unreachable: that path does not exist" in line


def test_no_remote_an_unknown_one_and_no_repository(
    pushed: tuple[Path, Path], tmp_path: Path
) -> None:
    a, _ = pushed
    assert "no DVC remote named 'nope'" in _error_line(_remote(a, "check", "-r", "nope"))
    run_ok(a, sys.executable, "-m", "dvc", "remote", "remove", "store")
    assert "no DVC remote is set" in _error_line(_remote(a, "check"))
    assert "is not a DVC repository" in _error_line(_remote(tmp_path, "check"))


def test_only_the_named_stages_are_checked(pushed: tuple[Path, Path]) -> None:
    a, _ = pushed
    line = _error_line(_remote(a, "check", "nosuch"))
    assert "no stage named 'nosuch'" in line


def test_a_remote_nothing_answers_at_and_a_missing_plugin(
    pushed: tuple[Path, Path], tmp_path: Path
) -> None:
    """An http remote on a closed port, and an s3 remote when dvc-s3 is not installed
    (as in this project's environment): one line each, naming the remote."""
    import importlib.util

    a, _ = pushed
    dvc = (sys.executable, "-m", "dvc", "remote", "add")
    run_ok(a, *dvc, "web", "http://127.0.0.1:9/eagle3")
    line = _error_line(_remote(a, "check", "-r", "web"))
    assert "remote 'web' at http://127.0.0.1:9/eagle3 is unreachable: nothing is there" in line
    if importlib.util.find_spec("dvc_s3") is not None:
        pytest.skip("dvc-s3 is installed here: the missing-plugin line cannot be shown")
    run_ok(a, *dvc, "bucket", "s3://bucket/eagle3")
    line = _error_line(_remote(a, "pull", "-r", "bucket"))
    assert "remote 'bucket': s3 is supported, but requires 'dvc-s3'" in line
    assert "pip install 'dvc[<scheme>]'" in line
