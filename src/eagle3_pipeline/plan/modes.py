"""Offline vs online hidden states, and the same job on two nodes: where the disk and the
GPUs go, with the commands.

Offline, extraction writes every token's states (``bytes_per_token`` x tokens) and the
GPUs run vLLM, then training, one after the other. Online, the train stage serves the
target itself and discards the states after each step: the disk holds only the batches in
flight, but vLLM and the trainers hold GPU memory at the same time, so the plan splits it
(one node: vLLM's ``gpu_memory_utilization`` lowered so the trainers fit beside it; two
nodes: vLLM on one, torchrun on the other). All figures are estimates from the config and
the target's config.json; none is measured here.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config import Config
from eagle3_pipeline.plan.resources import DraftEstimate, StorageEstimate
from eagle3_pipeline.plan.target_info import TargetInfo
from eagle3_pipeline.plan.weights import ServingEstimate
from eagle3_pipeline.serving.engine import build_engine

GIB = 1024**3
# vLLM beside its weights during extraction (prompts only, max_tokens=1): KV cache for the
# requests in flight and activations; an allowance, not a measurement.
EXTRACT_KV_RESERVE = 6 * GIB
CUDA_CONTEXT = 1 * GIB  # per trainer process
MAX_SHARED_UTILIZATION = 0.95  # of a GPU's memory, vLLM and the trainers together
PREFETCH = 2  # train.prefetch_batches' default online
STAGING = "/shared/eagle3-staging"  # a directory both nodes mount (the connector's files)
PORT_DP_RPC = 13345


def _q(v: Any) -> str:
    return shlex.quote(str(v))


def _staging_bytes(cfg: Config, storage: StorageEstimate, ranks: int) -> float:
    """Online disk: each rank's batch in training plus its prefetched ones, as connector
    files (the model's dtype; ``bytes_per_token`` assumes extract.dtype is the same)."""
    depth = cfg.train.prefetch_batches if cfg.train.prefetch_batches is not None else PREFETCH
    return (depth + 1) * cfg.train.tokens_per_step * storage.bytes_per_token * ranks


def hidden_state_modes(
    cfg: Config,
    target: TargetInfo,
    storage: StorageEstimate,
    draft: DraftEstimate,
    serving: ServingEstimate | None,
    ref: str,
) -> dict[str, Any]:
    """Both modes for this profile, and the two-node layout (GPU profiles)."""
    hw = cfg.hardware
    nproc = cfg.train.nproc or max(1, hw.gpu_count)
    offline = {
        "hidden_states_bytes": storage.total_bytes,
        "gpus": (
            f"extract: vLLM on {serving.gpus_used} GPU(s), then train: {nproc} "
            "worker(s) on the same GPUs, one after the other"
        )
        if serving
        else "extract, then train, on this machine's cores",
        "command": "dvc exp run -S extract.mode=offline"
        + (" -S extract.backend=vllm" if serving else ""),
    }
    online: dict[str, Any] = {
        "hidden_states_bytes": 0,
        "staging_bytes": _staging_bytes(cfg, storage, nproc),
        "command": "dvc exp run -S extract.mode=online",
    }
    out: dict[str, Any] = {"offline": offline, "online": online}
    if serving is None:
        online["gpus"] = "vLLM (CPU build) and the trainer share this machine's cores"
        return out
    gpu = (hw.gpu_memory_mib or 0) * 1024**2
    vllm_need = serving.weights_per_gpu_bytes + EXTRACT_KV_RESERVE
    train_need = draft.train_memory_bytes + CUDA_CONTEXT
    util = math.ceil(vllm_need / gpu * 100) / 100 if gpu else 1.0
    shared = gpu > 0 and util * gpu + train_need <= MAX_SHARED_UTILIZATION * gpu
    online["one_node"] = {
        "fits": shared,
        "vllm_gpu_memory_utilization": util,
        "vllm_bytes_per_gpu": util * gpu,
        "train_bytes_per_gpu": train_need,
        "gpu_bytes": gpu,
    }
    eng = build_engine(
        replace_util(cfg, util), target.spec, ref, "extract", staging="/tmp/eagle3-online-XXXXXXXX"
    )
    if shared:
        online["gpus"] = (
            f"vLLM (TP {serving.tensor_parallel_size} x PP "
            f"{serving.pipeline_parallel_size}) and {nproc} trainers share the "
            f"GPUs: vLLM at gpu_memory_utilization {util:.2f}, each trainer "
            f"beside it; their compute interleaves"
        )
        online["command"] += f" -S hardware.serving.gpu_memory_utilization={util:.2f}"
        online["stage_runs"] = [
            eng.shell(cfg.extract.server.port),
            f"torchrun --standalone --nproc_per_node {nproc} -m "
            "eagle3_pipeline.train.worker --params params.yaml",
        ]
    else:
        online["gpus"] = (
            "does not fit on one node: vLLM's weights and the trainers exceed "
            "a GPU; run vLLM and the trainers on separate nodes (below)"
        )
    out["two_nodes"] = two_nodes(cfg, target, ref, nproc, util if shared else None)
    return out


def replace_util(cfg: Config, util: float) -> Config:
    """The config with vLLM's memory share lowered for sharing the GPUs."""
    serving = replace(cfg.hardware.serving, gpu_memory_utilization=util)
    return replace(cfg, hardware=replace(cfg.hardware, serving=serving))


def two_nodes(
    cfg: Config, target: TargetInfo, ref: str, nproc: int, shared_util: float | None
) -> dict[str, Any]:
    """Per-node commands for two nodes of this profile (node 0 reachable as $NODE0, one
    random $KEY for the run). ``shared_util``: vLLM's memory share when vLLM and the
    trainers fit on the same GPUs, else None (then vLLM gets node 0, the trainers node 1)."""
    port = cfg.extract.server.port
    out = Path(cfg.paths.train_state) / "rank0_metrics.json"  # as the plan's [commands]
    worker = f"-m eagle3_pipeline.train.worker --params params.yaml --out {out}"
    torchrun = [
        f"torchrun --nnodes 2 --node_rank {r} --nproc_per_node {nproc} "
        f"--master_addr $NODE0 --master_port 29500 {worker}"
        for r in range(2)
    ]
    model = _q(target.spec.name)
    env = (
        f"EAGLE3_ONLINE_URL=http://$NODE0:{port}/v1 EAGLE3_ONLINE_API_KEY=$KEY "
        f"EAGLE3_ONLINE_MODEL={model}"
    )
    plan: dict[str, Any] = {
        "requires": f"data/ and {STAGING} on a filesystem both nodes mount (extraction's "
        "files; online, vLLM's connector writes each request's states there and "
        "the trainer that asked deletes them), and a DVC remote both reach "
        "(dvc remote add -d store s3://BUCKET/eagle3; dvc push / dvc pull)",
        "offline": {
            "extract: each node serves the target and extracts its half of the rows": [
                f"python -m eagle3_pipeline.stages.extract extract.backend=vllm "
                f"extract.rank={r} extract.world_size=2   # node {r}"
                for r in range(2)
            ]
            + ["dvc commit extract && dvc push   # node 0, once both finished"],
            "train: torchrun over both nodes": [f"{c}   # node {r}" for r, c in enumerate(torchrun)]
            + ["dvc commit train && dvc push   # node 0: the draft to the remote"],
        },
    }
    python_ex = "python -m eagle3_pipeline.stages.extract extract.mode=online   # node 0"
    if shared_util is not None:
        eng = build_engine(
            replace_util(cfg, shared_util), target.spec, ref, "extract", staging=STAGING
        )
        serve = " ".join(_q(a) for a in eng.serve_argv(port, host="0.0.0.0"))
        dp = (
            f"--data-parallel-size 2 --data-parallel-size-local 1 --data-parallel-address "
            f"$NODE0 --data-parallel-rpc-port {PORT_DP_RPC}"
        )
        plan["online"] = {
            "every node: one vLLM engine (data parallel, one API on node 0) beside its trainers": [
                python_ex,
                f"VLLM_API_KEY=$KEY {serve} {dp}   # node 0",
                f"VLLM_API_KEY=$KEY {serve} {dp} --data-parallel-start-rank 1 --headless"
                "   # node 1",
                *(f"{env} {c}   # node {r}" for r, c in enumerate(torchrun)),
                "dvc commit train && dvc push   # node 0",
            ],
        }
    else:
        eng = build_engine(cfg, target.spec, ref, "extract", staging=STAGING)
        serve = " ".join(_q(a) for a in eng.serve_argv(port, host="0.0.0.0"))
        plan["online"] = {
            "node 0 serves the target, node 1 trains": [
                python_ex,
                f"VLLM_API_KEY=$KEY {serve}   # node 0",
                f"{env} torchrun --standalone --nproc_per_node {nproc} {worker}   # node 1",
                "dvc commit train && dvc push   # node 1",
            ],
        }
    return plan
