"""Integrity and fail-fast: a damaged artifact is never trusted, a failed stage loses
nothing, a draft does not depend on where it was trained, caches are keyed on content,
one line instead of a flood. The end-to-end checks through ``dvc repro`` live in
``test_pipeline_dvc.py``; these run the pieces on real files, real DVC and real processes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from commands import dvc
from safetensors.torch import save_file

from eagle3_pipeline.core.config import Config

ROOT = Path(__file__).resolve().parents[2]


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _hs_file(path: Path, n: int = 12) -> None:
    save_file(
        {"token_ids": torch.arange(n, dtype=torch.int64), "hidden_states": torch.randn(n, 4, 8)},
        str(path),
    )


# --------------------------------------------------------------------------- 1. the cache


def test_the_project_cache_copies_so_an_edit_in_place_cannot_reach_it() -> None:
    """The default link type gives an output its own bytes (reflink where the filesystem
    has it, else a copy): truncating a workspace file leaves the cache object whole."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / ".dvc" / "config")
    types = [t.strip() for t in cfg.get("cache", "type").strip('"').split(",")]
    assert types and set(types) <= {"reflink", "copy"}


@pytest.mark.integration
def test_a_damaged_hardlinked_output_takes_its_cache_object_with_it(tmp_path: Path) -> None:
    """With cache.type=hardlink (a user's choice for huge hidden states) the damaged file
    and its cache object are one inode; removing both lets DVC cache the redone file."""
    from eagle3_pipeline.runtime.dvc_cache import release_damaged

    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    dvc(tmp_path, "init", "-q")
    dvc(tmp_path, "config", "cache.type", "hardlink")
    out = tmp_path / "hs"
    out.mkdir()
    _hs_file(out / "hs_0.safetensors")
    good = (out / "hs_0.safetensors").read_bytes()
    dvc(tmp_path, "add", "hs")
    f = out / "hs_0.safetensors"
    assert f.stat().st_nlink == 2
    os.chmod(f, 0o644)
    os.truncate(f, 100)  # what `truncate -s` as root does: the cache object shrinks too
    removed = release_damaged(f, tmp_path)
    assert len(removed) == 1 and not removed[0].exists() and not f.exists()
    f.write_bytes(good)  # the stage redoes it
    dvc(tmp_path, "add", "hs")
    dvc(tmp_path, "checkout", "--relink", "hs")
    assert f.read_bytes() == good  # not re-linked to a damaged object
    assert "up to date" in dvc(tmp_path, "status").stdout.lower()


def test_a_whole_copied_output_shares_nothing(tmp_path: Path) -> None:
    from eagle3_pipeline.runtime.dvc_cache import shared_cache_objects

    (tmp_path / ".dvc" / "cache").mkdir(parents=True)
    f = tmp_path / "a.safetensors"
    _hs_file(f)
    assert shared_cache_objects(f, tmp_path) == []


# --------------------------------------------------------------------------- 2. inputs


def test_train_names_a_truncated_hidden_state_file_and_the_stage_that_rebuilds_it(
    tmp_path: Path,
) -> None:
    from eagle3_pipeline.train.errors import TrainingError
    from eagle3_pipeline.train.inputs import _check_files

    for i in range(3):
        _hs_file(tmp_path / f"hs_{i}.safetensors")
    bad = tmp_path / "hs_2.safetensors"
    os.truncate(bad, bad.stat().st_size // 2)
    spec = SimpleNamespace(aux_layer_ids=[0, 1, 2], hidden_size=8)  # what it reads
    with pytest.raises(TrainingError) as exc:
        _check_files(tmp_path, spec, 3)  # type: ignore[arg-type]
    msg = str(exc.value)
    assert "\n" not in msg and str(bad) in msg and "`dvc repro extract`" in msg


def test_a_damaged_prepared_dataset_is_one_line_naming_it(tmp_path: Path) -> None:
    from datasets import Dataset

    from eagle3_pipeline.train.errors import TrainingError
    from eagle3_pipeline.train.inputs import count_rows

    ds = Dataset.from_dict({"input_ids": [[1, 2]], "loss_mask": [[1, 1]], "seq_len": [2]})
    ds.save_to_disk(str(tmp_path / "prepared"))
    arrow = next((tmp_path / "prepared").glob("*.arrow"))
    os.truncate(arrow, 40)
    with pytest.raises(TrainingError) as exc:
        count_rows(tmp_path / "prepared")
    msg = str(exc.value)
    assert "\n" not in msg and "prepared" in msg and "`dvc repro prepare`" in msg


def test_extraction_drops_a_damaged_file_and_keeps_the_whole_ones(tmp_path: Path) -> None:
    from eagle3_pipeline.extract.extraction import drop_damaged

    class Rows:
        lengths = [12, 12, 12]

        def __len__(self) -> int:
            return 3

    files = {}
    for i in range(3):
        files[i] = tmp_path / f"hs_{i}.safetensors"
        _hs_file(files[i])
    os.truncate(files[1], 64)
    kept = drop_damaged(files, Rows(), 4, 8, "float32")  # type: ignore[arg-type]
    assert sorted(kept) == [0, 2] and not files[1].exists()


# --------------------------------------------------------------------------- 4. outputs


def _project(tmp_path: Path) -> Path:
    (tmp_path / ".dvc" / "tmp").mkdir(parents=True)
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  train:\n    cmd: x\n    outs:\n      - ${paths.draft}\n"
        "      - ${paths.details}/train.json:\n          cache: false\n"
        "      - ${paths.train_state}:\n          persist: true\n          cache: false\n"
        "    metrics:\n      - ${paths.live}/train/metrics.json:\n          cache: false\n"
    )
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    return tmp_path


def test_a_failed_stage_gets_its_last_successful_uncached_outputs_back(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """Run 1 succeeds and writes details and the headline; DVC then deletes them (as it
    does before a rerun); run 2 fails after half-writing one: both come back, byte for
    byte. The persistent resume state is never touched."""
    from eagle3_pipeline.core.errors import StageError
    from eagle3_pipeline.stages.runner import run_stage

    monkeypatch.chdir(_project(tmp_path))
    details = Path("metrics/details/train.json")
    headline = Path("dvclive/train/metrics.json")
    state = Path("data/train_state/state.json")

    def good(cfg) -> None:
        for p, text in ((details, '{"steps": 7}'), (headline, '{"step": 7}'), (state, "s1")):
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)

    def bad(cfg) -> None:
        details.parent.mkdir(parents=True, exist_ok=True)
        details.write_text('{"steps": ')  # half-written
        state.write_text("s2")
        raise StageError("refused")

    run_stage("train", "", _whole, good, [])
    details.unlink()
    headline.unlink()  # what DVC does before it reruns the stage
    with pytest.raises(SystemExit) as exc:
        run_stage("train", "", _whole, bad, [])
    assert exc.value.code == 1
    assert details.read_text() == '{"steps": 7}' and headline.read_text() == '{"step": 7}'
    assert state.read_text() == "s2"  # resume state is the stage's own
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "error: train: refused"
    assert any("dvc checkout train" in ln for ln in err)


def _whole(cfg: Config) -> Config:
    """A stage body's view here: the whole config (the bodies below read none of it)."""
    return cfg


def test_a_crash_that_is_a_bug_restores_too(tmp_path: Path, monkeypatch) -> None:
    from eagle3_pipeline.stages.runner import run_stage

    monkeypatch.chdir(_project(tmp_path))
    details = Path("metrics/details/train.json")

    def good(cfg) -> None:
        details.parent.mkdir(parents=True, exist_ok=True)
        details.write_text("v1")

    def crash(cfg) -> None:
        details.unlink()
        raise ZeroDivisionError

    run_stage("train", "", _whole, good, [])
    with pytest.raises(ZeroDivisionError):
        run_stage("train", "", _whole, crash, [])
    assert details.read_text() == "v1"


# --------------------------------------------------------------------------- 5. drafts


def test_the_same_training_in_two_clones_gives_byte_identical_drafts(
    tiny_target: Path, tmp_path: Path
) -> None:
    """The train stage, run on the same inputs in two clones at different paths, writes
    the same draft bytes: nothing of where it ran is in them (the target is named
    relative to the draft)."""
    import eagle3_pipeline.stages.extract as extract
    import eagle3_pipeline.stages.prepare as prepare
    from eagle3_pipeline.core.config import load_config
    from eagle3_pipeline.stages.train import main as train

    data = ["data.regenerate=false", "data.max_seq_len=128", "train.samples=12"]
    steps = [
        "extract.fsync=false",
        "train.epochs=1",
        "train.max_steps=2",
        "train.tokens_per_step=512",
        "train.draft_vocab_size=512",
        "train.val_fraction=0.2",
        "train.checkpoint_every_steps=1000",
    ]
    a = tmp_path / "clone_a"
    b = tmp_path / "elsewhere" / "clone_b"
    shutil.copytree(tiny_target, a, symlinks=True)
    old = os.getcwd()
    try:
        os.chdir(a)
        cfg = load_config([*data, *steps])
        prepare.run(prepare.INPUTS.from_config(cfg), progress=False)
        extract.run(extract.INPUTS.from_config(cfg))
        shutil.copytree(a, b, symlinks=True)  # the same inputs, in another clone
        for clone in (a, b):
            os.chdir(clone)
            train([*data, *steps])
    finally:
        os.chdir(old)
    trained = [json.loads((c / "metrics/details/train.json").read_text()) for c in (a, b)]
    assert [t["steps"] for t in trained] == [2, 2]  # trained, not just initialised
    assert trained[0]["val_loss"] == trained[1]["val_loss"] != trained[0]["val_loss_untrained"]
    for name in ("config.json", "model.safetensors"):
        assert _md5(a / "data/draft" / name) == _md5(b / "data/draft" / name), name
    verifier = json.loads((a / "data/draft/config.json").read_text())["speculators_config"][
        "verifier"
    ]["name_or_path"]
    assert verifier == "../target/model"
    assert (a / "data/draft" / verifier / "config.json").is_file()


def test_the_reload_finds_a_target_named_relative_to_the_draft(
    tiny_target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workdirs import make_workdir

    from eagle3_pipeline.validate.checkpoint import validate_checkpoint

    work = make_workdir(tiny_target, tmp_path / "w")
    monkeypatch.chdir(tmp_path)  # not the clone: the relative name resolves from the draft
    report = validate_checkpoint(work / "data/draft", None, reload=True)
    assert report.facts["verifier_name_or_path"] == "../target/model"
    assert not report.errors, report.errors
    reloaded = [f for f in report.findings if f.code == "reload"]
    assert reloaded and reloaded[0].level == "info", reloaded  # speculators reloaded it


# --------------------------------------------------------------------------- 6. caches


def test_the_regeneration_key_follows_content_not_mtimes(tiny_target: Path, tmp_path: Path) -> None:
    from eagle3_pipeline.core.config import load_config
    from eagle3_pipeline.data.prepare import target_content
    from eagle3_pipeline.data.view import PrepareInputs

    cfg = load_config([f"paths.cache={tmp_path / 'cache'}"], conf_dir=str(ROOT / "conf"))
    a = tmp_path / "a"
    shutil.copytree(tiny_target / "data/target/model", a)
    time.sleep(0.01)
    b = tmp_path / "b"
    shutil.copytree(a, b, copy_function=shutil.copy)  # new inodes and mtimes, same bytes
    assert target_content(PrepareInputs.from_config(cfg), a) == target_content(
        PrepareInputs.from_config(cfg), b
    )
    weights = next(b.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert target_content(PrepareInputs.from_config(cfg), a) != target_content(
        PrepareInputs.from_config(cfg), b
    )


# --------------------------------------------------------------------------- 7. floods


def test_a_dead_server_is_named_dead_with_its_signal_and_log(tmp_path: Path) -> None:
    from eagle3_pipeline.serving.server import VllmServer

    server = VllmServer.__new__(VllmServer)
    server.log_file = tmp_path / "extract.log"
    server.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert server.death() is None
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    died = server.death()
    assert died is not None and "killed by SIGKILL" in died and str(server.log_file) in died


def test_repeated_warnings_are_counted_not_printed(capfd) -> None:
    code = (
        "import logging, warnings\n"
        "from eagle3_pipeline.core.logs import setup_logging\n"
        "setup_logging()\n"
        "log = logging.getLogger('speculators')\n"
        "for i in range(40): log.warning('Request for row %d failed, retrying', i)\n"
        "for i in range(30): warnings.warn(f'sample {i} unavailable')\n"
        "log.warning('something else')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = proc.stderr.strip().splitlines()
    assert sum("retrying" in ln for ln in lines) == 4  # 3 shown + the summary
    assert any(ln.startswith("note: 37 more warning(s) like this from speculators") for ln in lines)
    assert any(ln.startswith("note: 27 more warning(s)") and "py.warnings" in ln for ln in lines)
    assert any("something else" in ln for ln in lines)
    assert len(lines) < 15


def test_the_cause_of_a_dead_engine_is_its_root_error_not_the_wrapper() -> None:
    """A real vLLM 0.32 CPU log (an engine for a tiny Llama with head_dim 16, recorded
    from this machine): the wrappers ("Worker failed ... please check the stack trace
    above", "EngineDeadError ... See stack trace (above)") come last; the cause is the
    worker's own error -- whether the log ends at the EngineDeadError or after it."""
    from eagle3_pipeline.serving.server import cause

    text = (ROOT / "tests/fixtures/vllm_logs/cpu_head_dim16.log").read_text()
    want = "RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0"
    assert cause(text) == want
    upto_dead = text[: text.index("EngineDeadError") + len("EngineDeadError: x")]
    assert cause(upto_dead) == want
