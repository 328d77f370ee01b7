"""``extract.mode=online``: the extract stage records a manifest only, the train stage serves
the target in real vLLM (CPU build) and reads each batch's hidden states from it.

Equivalence: the same rows and seed trained offline (files written by the ``vllm``
backend, the same engine) and online give loss curves that agree to float32 rounding and
drafts whose acceptance agrees; a stage killed with SIGKILL leaves no server behind and
its rerun resumes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eagle3_pipeline.core.config import ConfigError, load_config
from eagle3_pipeline.extract.view import ExtractInputs
from eagle3_pipeline.train.view import TrainInputs

REPO = Path(__file__).resolve().parents[2]
DATA = [
    "data.regenerate=false",
    "data.max_seq_len=128",
    "data.heldout_size=4",
    "train.samples=30",
    "extract.fsync=false",
    "extract.dtype=float32",
]
TRAIN = [
    "train.epochs=2",
    "train.tokens_per_step=512",
    "train.draft_vocab_size=512",
    "train.val_fraction=0.2",
    "train.checkpoint_every_steps=1000",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(work: Path, module: str, *overrides: str, env: dict[str, str] | None = None) -> None:
    """A stage as DVC runs it: its own process, in ``work``."""
    proc = subprocess.run(
        [sys.executable, "-m", f"eagle3_pipeline.stages.{module}", *overrides],
        cwd=work,
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


def _losses(work: Path) -> list[float]:
    rows = (work / "dvclive/train/plots/metrics/train/loss.tsv").read_text().splitlines()[1:]
    return [float(r.split("\t")[1]) for r in rows]


@pytest.fixture(scope="module")
def offline_work(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Prepared rows and their hidden states written by the vllm backend (float32)."""
    work = tmp_path_factory.mktemp("online") / "offline"
    shutil.copytree(tiny_target, work, symlinks=True)
    port = _free_port()
    _run(work, "prepare", *DATA)
    _run(
        work,
        "extract",
        *DATA,
        "extract.backend=vllm",
        f"extract.server.port={port}",
        "extract.server.concurrency=4",
    )
    return work


@pytest.fixture
def short_temp() -> Iterator[Path]:
    """A temp directory of this test's own with a short path: vLLM puts its ZMQ sockets
    in ``TMPDIR``, whose paths may not pass 107 characters."""
    path = Path(tempfile.mkdtemp(prefix="e3-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


# --------------------------------------------------------------------------- no vLLM


def test_online_extract_writes_only_the_manifest(tiny_target: Path, tmp_path: Path) -> None:
    """The extract stage in online mode: every pre-batch check, a manifest naming the
    engine (staging directory left to the train stage), no hidden-state file (an offline
    run's files are removed); training without the stage's server is one clear error."""
    import eagle3_pipeline.stages.extract as extract
    import eagle3_pipeline.stages.prepare as prepare
    from eagle3_pipeline.train.distributed import Dist
    from eagle3_pipeline.train.errors import TrainingError
    from eagle3_pipeline.train.loop import DraftTrainer
    from eagle3_pipeline.train.plan import plan_training

    work = _copy(tiny_target, tmp_path / "w")
    old = os.getcwd()
    os.chdir(work)
    try:
        cfg = load_config([*DATA, "train.samples=12"])
        prepare.run(prepare.INPUTS.from_config(cfg), progress=False)
        extract.run(extract.INPUTS.from_config(cfg))  # offline (hf) first: files to be replaced
        hs = work / "data/hidden_states"
        assert len(list(hs.glob("hs_*.safetensors"))) > 0
        before = sorted(p.name for p in hs.iterdir())
        # a row vLLM could not take is refused before anything is touched
        short = load_config(
            [*DATA, "train.samples=12", "extract.mode=online", "hardware.serving.max_model_len=16"]
        )
        with pytest.raises(ConfigError, match="does not fit vLLM's max_model_len 16"):
            extract.run(ExtractInputs.from_config(short))
        assert sorted(p.name for p in hs.iterdir()) == before
        cfg = load_config([*DATA, "train.samples=12", "extract.mode=online"])
        extract.run(extract.INPUTS.from_config(cfg))
        assert sorted(p.name for p in hs.iterdir()) == ["manifest.json"]
        manifest = json.loads((hs / "manifest.json").read_text())
        assert manifest["mode"] == "online" and manifest["backend"] == "vllm"
        assert manifest["dtype"] == "float32"
        eng = manifest["online"]["engine"]
        assert eng["speculative_config"]["method"] == "extract_hidden_states"
        assert (
            eng["kv_transfer_config"]["kv_connector_extra_config"]["shared_storage_path"]
            == "${staging}"
        )
        details = json.loads((work / "metrics/details/extract.json").read_text())
        assert details["mode"] == "online" and details["samples_written"] == 0
        assert details["offline_files_removed"] > 0
        cfg = load_config([*DATA, "train.samples=12", *TRAIN])
        plan = plan_training(TrainInputs.from_config(cfg))
        assert plan.online is not None and plan.online.dtype == "float32"
        with pytest.raises(TrainingError, match="EAGLE3_ONLINE_URL"):
            DraftTrainer(plan, Dist(), progress=False)
    finally:
        os.chdir(old)


def test_the_guard_kills_the_group_when_the_stage_is_killed(tmp_path: Path) -> None:
    """``kill -9`` of a stage runs none of its cleanup: the guard leading the child's
    process group stops the group once its parent is gone, and removes the child's
    scratch directory."""
    script = tmp_path / "stage.py"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "in_flight.safetensors").write_bytes(b"x")
    script.write_text(
        "import time\n"
        "from eagle3_pipeline.runtime.processes import start_group\n"
        f"p = start_group(['sleep', '600'], remove=[{str(scratch)!r}])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    stage = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert stage.stdout is not None
    pgid = int(stage.stdout.readline())
    assert _group_alive(pgid)
    stage.kill()
    stage.wait()
    deadline = time.monotonic() + 20
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _group_alive(pgid)
    assert not scratch.exists()  # the killed stage's scratch files went with its child


def _group_alive(pgid: int) -> bool:
    import psutil

    alive = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return bool(alive)


# --------------------------------------------------------------------------- real vLLM


@pytest.mark.slow
def test_online_training_equals_offline_and_resumes_after_kill_9(
    offline_work: Path, tmp_path: Path, short_temp: Path
) -> None:
    online = _copy(offline_work, tmp_path / "online")
    # the stages' own temp directory: other tests' online runs (other xdist workers)
    # stage in the system's, so only this one tells whether ours cleaned up
    temp = short_temp
    env = {**os.environ, "TMPDIR": str(temp)}
    port = _free_port()
    _run(
        online,
        "extract",
        *DATA,
        "extract.mode=online",
        f"extract.server.port={port}",
        "extract.server.concurrency=4",
    )
    assert sorted(p.name for p in (online / "data/hidden_states").iterdir()) == ["manifest.json"]
    offline = _copy(offline_work, tmp_path / "offline")
    _run(offline, "train", *DATA, *TRAIN)
    _run(online, "train", *DATA, *TRAIN, env=env)
    a, b = _losses(offline), _losses(online)
    assert len(a) == len(b) > 4
    # vLLM computed both from the same engine; only its batching differed (float32 sums)
    worst = max(abs(x - y) / max(abs(x), 1e-6) for x, y in zip(a, b, strict=True))
    assert worst < 1e-3, (worst, a, b)
    ma = json.loads((offline / "metrics/details/train.json").read_text())
    mb = json.loads((online / "metrics/details/train.json").read_text())
    assert mb["hidden_states"] == "online" and ma["hidden_states"] == "offline"
    assert abs(ma["val_loss"] - mb["val_loss"]) <= 1e-3 * abs(ma["val_loss"])
    assert not list(temp.glob("eagle3-online-*"))
    # the drafts' acceptance, by our evaluator on the held-out prompts
    for work in (offline, online):
        _run(
            work,
            "validate",
            *DATA,
            *TRAIN,
            "validate.vllm=false",
            "validate.num_prompts=4",
            "validate.max_new_tokens=32",
        )
    va = json.loads((offline / "metrics/details/validate.json").read_text())
    vb = json.loads((online / "metrics/details/validate.json").read_text())
    assert abs(va["acceptance_length"] - vb["acceptance_length"]) <= 0.05, (va, vb)

    # kill -9 mid-training: no server outlives the stage, and the rerun resumes
    shutil.rmtree(online / "data/train_state")
    shutil.rmtree(online / "data/draft")
    args = [*DATA, *TRAIN, "train.epochs=3", "train.checkpoint_every_steps=2"]
    stage = subprocess.Popen(
        [sys.executable, "-m", "eagle3_pipeline.stages.train", *args],
        cwd=online,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    state = online / "data/train_state/state.json"
    deadline = time.monotonic() + 600
    while not (state.is_file() and json.loads(state.read_text())["global_step"] >= 2):
        assert stage.poll() is None, (stage.stderr.read() if stage.stderr else "")[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    stage.send_signal(signal.SIGKILL)
    stage.wait()
    deadline = time.monotonic() + 60
    while not _port_free(port) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _port_free(port), "the extraction server outlived the killed stage"
    deadline = time.monotonic() + 30  # the guard removes the killed run's staging files
    while list(temp.glob("eagle3-online-*")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not list(temp.glob("eagle3-online-*"))
    saved = json.loads(state.read_text())["global_step"]
    _run(online, "train", *args, env=env)
    assert not list(temp.glob("eagle3-online-*"))
    m = json.loads((online / "metrics/details/train.json").read_text())
    assert m["resumed"] and m["steps_this_run"] == m["steps"] - saved
    assert [
        int(r.split("\t")[0])
        for r in (online / "dvclive/train/plots/metrics/train/loss.tsv")
        .read_text()
        .splitlines()[1:]
    ] == list(range(1, m["steps"] + 1))


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
