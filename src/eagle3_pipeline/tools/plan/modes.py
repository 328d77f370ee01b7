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
from typing import Any

from eagle3_pipeline.core.config import Config
from eagle3_pipeline.plan.resources import DraftEstimate, StorageEstimate
from eagle3_pipeline.plan.target_info import TargetInfo
from eagle3_pipeline.runtime.precision import model_precision
from eagle3_pipeline.serving.engine import build_engine
from eagle3_pipeline.tools.plan.weights import ServingEstimate
from eagle3_pipeline.train.nodes import node_env

GIB = 1024**3
# vLLM beside its weights during extraction (prompts only, max_tokens=1): KV cache for the
# requests in flight and activations; an allowance, not a measurement.
EXTRACT_KV_RESERVE = 6 * GIB
CUDA_CONTEXT = 1 * GIB  # per trainer process
MAX_SHARED_UTILIZATION = 0.95  # of a GPU's memory, vLLM and the trainers together
PREFETCH = 2  # train.prefetch_batches' default online
STAGING = "/shared/eagle3-staging"  # a directory both nodes mount (the connector's files)
# Online hidden states stay on one node: the train stage serves the target itself, and
# vLLM's data parallelism across nodes is not wired into it (vLLM's CPU build serves a
# dense target data parallel with --headless, but not an MoE target: its expert dispatch
# has no CPU all_gatherv).
ONLINE_NODES_NOTE = (
    "not offered over nodes: the train stage serves the target on its own node; over "
    "several nodes extract offline (above), each node its share of the rows"
)
NODE0 = "$NODE0"  # node 0's address, as every multi-node command names it
TRAIN_STAGE = "eagle3_pipeline.stages.train"


def planned_dtype(cfg: Config) -> str:
    """The target's precision the stages will resolve (``model.dtype``, else preflight's
    choice, or what it will choose on this machine)."""
    m = cfg.model
    tiny = m.tiny is not None
    return model_precision(m.dtype, cfg.hardware.device, tiny, cfg.paths.precision).dtype


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
        if hw.nodes > 1:
            out["two_nodes"] = two_nodes(cfg, vllm=cfg.extract.backend == "vllm")
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
        replace_util(cfg, util),
        target.spec,
        ref,
        "extract",
        staging="/tmp/eagle3-online-XXXXXXXX",
        dtype=planned_dtype(cfg),
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
            "a GPU; extract offline instead (vLLM, then the trainers)"
        )
    out["two_nodes"] = two_nodes(cfg, vllm=True)
    return out


def replace_util(cfg: Config, util: float) -> Config:
    """The config with vLLM's memory share lowered for sharing the GPUs."""
    serving = replace(cfg.hardware.serving, gpu_memory_utilization=util)
    return replace(cfg, hardware=replace(cfg.hardware, serving=serving))


def train_on_nodes(nodes: int, env: str = "") -> list[str]:
    """Each node's train command over ``nodes`` nodes (node 0 reachable as $NODE0): the same
    stage on the same params.yaml, told its rank by the environment; each starts one
    torchrun agent (``--nnodes``), node 0's records the run. ``env``: more variables
    before each."""
    pre = f"{env} " if env else ""
    return [
        f"{pre}{node_env(r, NODE0)} python -m {TRAIN_STAGE} --params params.yaml   # node {r}"
        for r in range(nodes)
    ]


def two_nodes(cfg: Config, vllm: bool) -> dict[str, Any]:
    """Per-node commands for ``hardware.nodes`` nodes (two when the profile states one:
    the layout a GPU profile grows into), node 0 reachable as $NODE0. ``vllm``: extraction
    serves the target in vLLM (GPU profiles), else the configured backend."""
    nodes = max(2, cfg.hardware.nodes)
    backend = " extract.backend=vllm" if vllm else ""
    return {
        "nodes": nodes,
        "requires": "data/ on a filesystem every node mounts (each node writes its share of "
        "the hidden states there; the trainers read them all and resume from "
        "data/train_state), and a DVC remote they reach "
        "(dvc remote add -d store s3://BUCKET/eagle3; eagle3-remote push / eagle3-remote pull)",
        "offline": {
            f"extract: each node extracts its share of the rows ({nodes} shares)": [
                f"python -m eagle3_pipeline.stages.extract{backend} "
                f"extract.rank={r} extract.world_size={nodes}   # node {r}"
                for r in range(nodes)
            ]
            + ["dvc commit -f extract && eagle3-remote push   # node 0, once every node finished"],
            f"train: each node's stage starts one torchrun agent (--nnodes {nodes})": (
                train_on_nodes(nodes)
                + ["dvc commit -f train && eagle3-remote push   # node 0: the draft to the remote"]
            ),
        },
        "online": ONLINE_NODES_NOTE,
    }
