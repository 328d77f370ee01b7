"""The train stage's run: in this process on CPU, or ``torchrun`` with one worker per GPU
(or ``train.nproc`` gloo workers on CPU), then NVML's view of the GPUs once they exited.

CUDA always trains in workers, even on one GPU, so that the stage itself never holds a
CUDA context and can check, after they exited, that their memory went back to preflight's
reading and that no process is left holding a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import tempfile
from pathlib import Path

from eagle3_pipeline.core.errors import StageError
from eagle3_pipeline.runtime.gpu import GpuRelease, GpuSnapshot
from eagle3_pipeline.runtime.processes import group_members, process_group
from eagle3_pipeline.train.nodes import Node, failure, this_node
from eagle3_pipeline.train.online import online_server
from eagle3_pipeline.train.plan import plan_training
from eagle3_pipeline.train.record import Launcher, TrainRecord
from eagle3_pipeline.train.run import train
from eagle3_pipeline.train.view import TrainInputs

log = logging.getLogger(__name__)

WORKER_MODULE = "eagle3_pipeline.train.worker"
STOP_TIMEOUT_S = 30.0  # torchrun's grace after SIGTERM to stop its workers


def run_training(
    cfg: TrainInputs, preflight_snapshot: GpuSnapshot | None = None
) -> TrainRecord | None:
    """Train (or resume) the draft; the details' record (``paths.details``/train.json,
    not written here), None on a node other than 0. ``preflight_snapshot``: the preflight
    stage's GPU reading, compared with NVML's once the workers exited."""
    plan = plan_training(cfg)  # every refusal before any process starts
    with contextlib.ExitStack() as stack:
        if plan.online is not None:  # the workers inherit its endpoint
            stack.enter_context(online_server(plan.online))
        if plan.runtime.launched:
            node = this_node(plan.runtime.nodes)
            record = launch_torchrun(cfg, plan.runtime.world_size, plan.runtime.device, node)
        else:
            record = train(plan)
    if record is None:
        return None  # node 0 records the run
    if plan.runtime.device == "cuda":
        reading = gpu_reading(preflight_snapshot)
    else:
        reading = GpuRelease(mode="not applicable", reason="trained on CPU")
    if reading.clean is False:
        # this stage's own check: validate never reads this volatile reading
        log.warning("GPU memory NOT released after training: %s", "; ".join(reading.problems))
    elif reading.clean:
        log.info("GPU memory released after training, no pipeline process left")
    return dataclasses.replace(record, gpu=reading, gpu_released=reading.clean)


def _worker_env(device: str, nproc: int) -> dict[str, str]:
    env = dict(os.environ)
    if device == "cpu" and "OMP_NUM_THREADS" not in env:
        # torchrun's default is 1 thread per worker; CPU workers share the cores
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    return env


def launch_torchrun(
    cfg: TrainInputs, nproc: int, device: str = "cuda", node: Node | None = None
) -> TrainRecord | None:
    """Run this node's workers under torchrun and return rank 0's record with its
    ``launcher`` (None on a node other than 0, whose workers hold no rank 0).

    The workers get the stage's input view as a YAML file (:meth:`Inputs.dump`). torchrun runs in its own
    process group (:mod:`eagle3_pipeline.runtime.processes`) so that, on error or Ctrl-C, the
    whole group is stopped: no worker survives the stage. ``launcher.survivors`` counts the
    group's processes still alive once torchrun returned (killed then; 0 is the expected
    reading).
    """
    node = node or Node(1)
    with tempfile.TemporaryDirectory(prefix="eagle3-train-") as tmp:
        params = Path(tmp) / "params.yaml"
        cfg.dump(params)
        out = Path(tmp) / "train.json"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *node.torchrun_args(),
            f"--nproc_per_node={nproc}",
            "-m",
            WORKER_MODULE,
            "--params",
            str(params),
            "--out",
            str(out),
        ]
        log.info("launching: %s", " ".join(cmd))
        tail = bytearray()
        env = _worker_env(device, nproc)
        with process_group(cmd, STOP_TIMEOUT_S, "torchrun", tail, env=env) as proc:
            try:
                rc = proc.wait()
            finally:
                # torchrun reaps its workers; anything left in the group is killed on leaving
                survivors = group_members(proc.pid)
        if survivors:
            log.warning(
                "killed %d process(es) left in torchrun's group: %s", len(survivors), survivors
            )
        if rc != 0:
            raise StageError(failure(node, rc, tail.decode("utf-8", errors="replace")))
        if not node.main:
            return None
        record = TrainRecord.read(out)  # rank 0's, type-checked as any record read back
        rdzv = " ".join(node.torchrun_args())
        launcher = Launcher(
            command=f"torchrun {rdzv} --nproc_per_node={nproc} -m {WORKER_MODULE}",
            nproc=nproc,
            nodes=node.nodes,
            process_group=proc.pid,
            survivors=len(survivors),
        )
        return dataclasses.replace(record, launcher=launcher)


def gpu_reading(before: GpuSnapshot | None) -> GpuRelease:
    """NVML after the workers exited, compared with preflight's reading ``before`` when
    there is one."""
    from eagle3_pipeline.runtime import gpu

    after = gpu.snapshot()
    if after.mode != "cuda":
        return GpuRelease(mode="not applicable", reason=after.reason or "no GPU")
    problems = gpu.compare_snapshots(before, after) if before else []
    return GpuRelease(
        mode="cuda",
        after_workers_exit=after,
        compared_with_preflight=before is not None,
        clean=not problems,
        problems=problems,
    )
