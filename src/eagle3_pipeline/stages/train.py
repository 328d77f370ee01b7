"""Stage `train`: train the EAGLE-3 draft on the extracted hidden states.

Writes data/draft/ (speculators format, what validate loads), data/train_state/ (resumable
state; DVC `persist`), plots/train/ (steps.tsv, epochs.tsv, curves.png) and
metrics/train.json. On CPU it trains in this process; on CUDA it launches torchrun with one
worker per GPU of the hardware profile and, once they have exited, records NVML's view of
the GPUs (memory back to preflight's reading, no process left holding a GPU). With
``train.nproc=N`` (N > 1) on CPU it starts the same torchrun launch, N gloo workers.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config import Config, metrics_path
from eagle3_pipeline.core.errors import StageError
from eagle3_pipeline.core.io import atomic_write_json
from eagle3_pipeline.stages.runner import run_stage

log = logging.getLogger(__name__)


def gpu_reading(cfg: Config) -> dict[str, Any]:
    """NVML after the workers exited, compared with preflight's reading when it has one."""
    from eagle3_pipeline.preflight.checks import gpu

    after = gpu.snapshot()
    if after.get("mode") != "cuda":
        return {"mode": "not applicable", "reason": after.get("reason", "no GPU")}
    before: dict[str, Any] | None = None
    pre = metrics_path(cfg, "preflight")
    if pre.is_file():
        data = json.loads(pre.read_text(encoding="utf-8"))
        before = data.get("snapshot")  # written by preflight.run_preflight
    problems = gpu.compare_snapshots(before, after) if before else []
    return {
        "after_workers_exit": after,
        "compared_with_preflight": before is not None,
        "clean": not problems,
        "problems": problems,
    }


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``, from /proc (Linux)."""
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # state, ppid, pgrp, ...
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def launch_torchrun(cfg: Config, nproc: int, device: str = "cuda") -> dict[str, Any]:
    """Run the workers under torchrun and return rank 0's metrics (+ ``launcher``).

    The workers get the exact resolved config as a params file. torchrun runs in its own
    session so that, on error or Ctrl-C, the whole process group is terminated: no worker
    survives the stage. ``launcher.survivors`` counts the group's processes still alive
    once torchrun returned (killed then; 0 is the expected reading).
    """
    from omegaconf import OmegaConf

    with tempfile.TemporaryDirectory(prefix="eagle3-train-") as tmp:
        params = Path(tmp) / "params.yaml"
        params.write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)), encoding="utf-8")
        out = Path(tmp) / "metrics.json"
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", "-m", "eagle3_pipeline.train.trainer",
            "--params", str(params), "--out", str(out),
        ]
        log.info("launching: %s", " ".join(cmd))
        env = dict(os.environ)
        if device == "cpu" and "OMP_NUM_THREADS" not in env:
            # torchrun's default is 1 thread per worker; CPU workers share the cores
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
        proc = subprocess.Popen(cmd, start_new_session=True, env=env)
        survivors: list[int] = []
        try:
            rc = proc.wait()
        except BaseException:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise
        finally:
            # torchrun reaps its workers; anything left in the group is killed here
            survivors = group_members(proc.pid)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if survivors:
            log.warning("killed %d process(es) left in torchrun's group: %s",
                        len(survivors), survivors)
        if rc != 0:
            raise StageError(f"training workers failed (torchrun exit code {rc}); see above")
        metrics = json.loads(out.read_text(encoding="utf-8"))
        metrics["launcher"] = {
            "command": f"torchrun --standalone --nproc_per_node={nproc} "
                       "-m eagle3_pipeline.train.trainer",
            "nproc": nproc,
            "process_group": proc.pid,
            "survivors": len(survivors),
        }
        return metrics


def run(cfg: Config) -> None:
    from eagle3_pipeline.train import trainer as training

    try:
        plan = training.plan_training(cfg)  # every refusal before any process starts
        if plan.runtime.launched:
            metrics = launch_torchrun(cfg, plan.runtime.world_size, plan.runtime.device)
        else:
            metrics = training.train(cfg)
        if plan.runtime.device == "cuda":
            metrics["gpu"] = gpu_reading(cfg)
        else:
            metrics["gpu"] = {"mode": "not applicable", "reason": "trained on CPU"}
    except (training.TrainingError, training.SimulatedFailure) as exc:
        raise StageError(str(exc)) from None
    atomic_write_json(metrics_path(cfg, "train"), metrics)
    log.info(
        "draft: val loss %.4f (untrained %.4f), per-position accuracy %s, %d steps, "
        "%.0f tokens/s", metrics["val_loss"], metrics["val_loss_untrained"] or float("nan"),
        [round(a, 3) for a in metrics["val_accuracy_per_position"]], metrics["steps"],
        metrics["tokens_per_s"],
    )


def main(argv: list[str] | None = None) -> None:
    run_stage("train", __doc__ or "", run, argv)


if __name__ == "__main__":
    main()
