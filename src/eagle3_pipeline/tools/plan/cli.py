"""Plan before you spend: resource estimates and the exact commands for a profile.

``python -m eagle3_pipeline.tools.plan.cli [overrides] [--strict] [--out DIR]`` (also ``eagle3-plan``)
reads the composed config and the target's ``config.json`` -- never its weights -- and
prints, then writes to ``DIR/plan.json``: the target summary, hidden-state storage against
free disk, the draft's size and training memory against the GPUs, vLLM serving memory per
GPU, time estimates (assumed or measured), and the commands each stage would run.

Why it exists: a Kimi-K2.5 run costs hours of an 8-GPU machine and ~56 KiB of disk per
token of hidden states; finding out at hour two that the disk is full is the expensive way.
It must run in seconds on a laptop, so it imports neither torch, transformers nor
speculators (everything comes from the other modules of :mod:`eagle3_pipeline.plan`).
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config import Config, ConfigError, load_config, stage_argparser
from eagle3_pipeline.core.io import atomic_write_json
from eagle3_pipeline.plan.resources import (
    FreeBytesFn,
    disk_need,
    estimate_draft,
    estimate_storage,
    estimate_time,
    free_bytes,
    host_memory_bytes,
)
from eagle3_pipeline.plan.target_info import TargetInfo, load_target
from eagle3_pipeline.plan.units import fmt_duration, fmt_gb, fmt_gib
from eagle3_pipeline.serving.engine import build_engine
from eagle3_pipeline.tools.plan.modes import (
    EXTRACT_KV_RESERVE,
    TRAIN_STAGE,
    hidden_state_modes,
    planned_dtype,
    train_on_nodes,
)
from eagle3_pipeline.tools.plan.weights import estimate_serving, estimate_target_weights

# The torchrun workers the train stage launches.
TRAIN_WORKER = "eagle3_pipeline.train.worker"


@dataclass
class Plan:
    data: dict[str, Any]
    problems: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.problems


def _q(value: Any) -> str:
    if isinstance(value, (dict, list)):
        value = json.dumps(value, separators=(",", ":"))
    return shlex.quote(str(value))


def _target_ref(cfg: Config) -> str:
    """What vLLM is pointed at: the local path when set, else the hub id (the engine adds
    the revision and remote-code flags)."""
    m = cfg.model
    if m.built_here:
        return str(Path(cfg.paths.target) / "model")
    return m.path or m.hub_id or ""


def _line(parts: list[str]) -> str:
    return " ".join(parts)


def commands(cfg: Config, target: TargetInfo, overrides: list[str]) -> dict[str, Any]:
    """The exact command lines for this profile."""
    from eagle3_pipeline.extract.vllm_backend import STAGING
    from eagle3_pipeline.train.plan import TrainPaths  # paths only; no torch at import time
    from eagle3_pipeline.train.view import TrainInputs

    paths = TrainPaths.from_config(TrainInputs.from_config(cfg))
    ref = _target_ref(cfg)
    draft_dir = str(paths.draft)
    out: dict[str, Any] = {
        "pipeline": _line(["dvc", "exp", "run", *(f"-S {_q(o)}" for o in overrides)]),
    }
    cuda = cfg.hardware.device == "cuda"
    dtype = planned_dtype(cfg)
    if cuda or cfg.extract.backend == "vllm":
        engine = build_engine(
            cfg,
            target.spec,
            ref,
            "extract",
            staging=Path(cfg.paths.hidden_states) / STAGING,
            dtype=dtype,
        )
        out["extract_server"] = engine.shell(cfg.extract.server.port)
    else:
        out["extract"] = "python -m eagle3_pipeline.stages.extract --params params.yaml"
    hw = cfg.hardware
    nproc = cfg.train.nproc or hw.gpu_count  # what the train stage launches per node
    if hw.nodes > 1:
        out["train"] = train_on_nodes(hw.nodes)
    elif cuda and nproc > 1:
        worker_out = str(paths.state / "rank0_metrics.json")
        train_args = ["-m", TRAIN_WORKER, "--params", "params.yaml", "--out", worker_out]
        out["train"] = [
            f"python -m {TRAIN_STAGE} --params params.yaml   # launches:",
            _line(["torchrun", "--standalone", f"--nproc_per_node {nproc}", *train_args]),
        ]
    else:
        out["train"] = [f"python -m {TRAIN_STAGE} --params params.yaml"]
    out["serve_draft"] = build_engine(
        cfg,
        target.spec,
        ref,
        "validate",
        dtype=dtype,
        draft_dir=draft_dir,
        k=cfg.train.speculative_tokens,
        draft_mla=cfg.train.draft.layer_type == "mla",
    ).shell(cfg.validate.server.port)
    base = (cfg.model.hub_id or cfg.model.name).split("/")[-1]
    repo = f"YOUR_ORG/{base}-EAGLE3"  # placeholder: the account you publish under
    msg = _q(f"EAGLE-3 draft for {cfg.model.hub_id or cfg.model.name}")
    out["upload"] = [
        f"hf upload {repo} {_q(draft_dir)} . --repo-type model --commit-message {msg}",
        f"huggingface-cli upload {repo} {_q(draft_dir)} . --commit-message {msg}   # older clients",
    ]
    return out


def build_plan(
    cfg: Config,
    overrides: list[str] | None = None,
    free_fn: FreeBytesFn = free_bytes,
    host_memory: int | None = None,
) -> Plan:
    """Every estimate plus one line per problem that would stop the run."""
    target = load_target(cfg.model)
    spec = target.spec
    problems: list[str] = []
    storage = estimate_storage(cfg, target)
    draft = estimate_draft(cfg, target)
    disk = disk_need(cfg, storage, draft, free_fn)
    if (p := disk.problem()) is not None:
        problems.append(f"disk: {p}")
    hw = cfg.hardware
    if hw.device == "cuda":
        device_mem, device_what = (hw.gpu_memory_mib or 0) * 1024**2, f"a {hw.gpu_name} GPU"
    else:
        device_mem = host_memory if host_memory is not None else host_memory_bytes()
        device_what = "this host's memory"
    if device_mem and draft.train_memory_bytes > device_mem:
        problems.append(
            f"draft: training needs about {fmt_gib(draft.train_memory_bytes)} per process, "
            f"{device_what} has {fmt_gib(device_mem)} (hardware={hw.name}): lower "
            "train.draft_vocab_size, the tokens per step or the draft's size"
        )
    serving = None
    weights = estimate_target_weights(target)
    if hw.device == "cuda":
        serving = estimate_serving(cfg, weights)
        if serving.gpus_used > serving.gpus_available:
            problems.append(
                f"serving: TP x PP x DP = {serving.gpus_used} GPUs, hardware={hw.name} has "
                f"{serving.gpus_available}: lower hardware.serving sizes"
            )
        if serving.headroom_per_gpu_bytes <= 0:
            problems.append(
                f"serving: target weights need {fmt_gib(serving.weights_per_gpu_bytes)} per GPU, "
                f"{fmt_gib(serving.usable_per_gpu_bytes)} usable at gpu_memory_utilization="
                f"{hw.serving.gpu_memory_utilization}: raise tensor/pipeline parallel size"
            )
    if not spec.vllm_eagle3_supported:
        problems.append(
            f"target: vLLM has no EAGLE-3 support for {spec.vllm_architecture}: the draft could "
            "be trained but not served"
        )
    t_extract, t_train = estimate_time(cfg, storage)
    modes = hidden_state_modes(cfg, target, storage, draft, serving, _target_ref(cfg))
    data = {
        "config": {
            "model": cfg.model.name,
            "hardware": hw.name,
            "overrides": list(overrides or []),
            "train.samples": cfg.train.samples,
            "train.epochs": cfg.train.epochs,
            "extract.dtype": cfg.extract.dtype,
        },
        "target": {
            "source": target.source,
            "architecture": spec.architecture,
            "vllm_architecture": spec.vllm_architecture,
            "vllm_eagle3_supported": spec.vllm_eagle3_supported,
            "nested": spec.nested,
            "text_config_key": spec.text_config_key,
            "num_layers": spec.num_layers,
            "hidden_size": spec.hidden_size,
            "vocab_size": spec.vocab_size,
            "attention": spec.attention,
            "num_experts": spec.num_experts,
            "quantization": spec.quantization,
            "aux_layer_ids": spec.aux_layer_ids,
            "aux_layer_ids_source": spec.aux_layer_ids_source,
            "captured_layer_ids": target.captured_layer_ids,
        },
        "storage": {**storage.to_dict(), "disk": disk.to_dict()},
        "draft": {**draft.to_dict(), "device_memory_bytes": device_mem},
        "target_weights": weights.to_dict(),
        "serving": serving.to_dict() if serving else None,
        "time": {"extract": t_extract.to_dict(), "train": t_train.to_dict()},
        "commands": commands(cfg, target, list(overrides or [])),
        "modes": modes,
        "problems": problems,
        "fits": not problems,
    }
    return Plan(data, problems)


def _count(n: float) -> str:
    return f"{n / 1e9:,.1f} B" if n >= 1e9 else f"{n / 1e6:,.2f} M"


def render_plan(plan: Plan) -> str:
    """The human-readable table."""
    d = plan.data
    t, s, dr, tm = d["target"], d["storage"], d["draft"], d["time"]
    disk = s["disk"]
    rows: list[tuple[str, str]] = []

    def section(name: str) -> None:
        rows.append((f"[{name}]", ""))

    section("target")
    rows += [
        ("config", t["source"]),
        ("architecture", f"{t['architecture']} (vLLM {t['vllm_architecture']})"),
        ("nested", f"{t['nested']} ({t['text_config_key']})" if t["nested"] else "no"),
        (
            "shape",
            f"{t['num_layers']} layers, hidden {t['hidden_size']:,}, vocab {t['vocab_size']:,}, "
            f"{t['attention']} attention, {t['num_experts']} experts",
        ),
        (
            "layers captured",
            f"aux {t['aux_layer_ids']} ({t['aux_layer_ids_source']}) + final "
            f"-> {t['captured_layer_ids']}",
        ),
    ]
    section("hidden states")
    rows += [
        (
            "bytes per token",
            f"{s['bytes_per_token']:,} = {len(s['captured_layer_ids'])} x {s['hidden_size']:,} x "
            f"{s['bytes_per_token'] // (len(s['captured_layer_ids']) * s['hidden_size'])} "
            f"({s['dtype']})",
        ),
        ("tokens", f"{s['total_tokens']:,.0f} for {s['samples']:,} conversations"),
        ("basis", s["basis"]),
        ("total", fmt_gb(s["total_bytes"]) + (" (upper bound)" if s["upper_bound"] else "")),
        (
            "disk",
            f"need {fmt_gb(disk['need_bytes'])} (hidden states + checkpoint "
            f"{fmt_gb(disk['checkpoint_bytes'])} + margin {fmt_gb(disk['margin_bytes'])}), "
            f"free under {disk['path']}/: "
            f"{fmt_gb(disk['free_bytes'])} -> {'fits' if disk['fits'] else 'DOES NOT FIT'}",
        ),
    ]
    section("draft")
    rows += [
        (
            "shape",
            f"{dr['layers']} layer(s), hidden {dr['hidden_size']:,}, {dr['num_heads']} heads "
            f"x {dr['head_dim']}, {dr['num_kv_heads']} kv heads, MLP {dr['intermediate_size']:,}, "
            f"draft vocab {dr['draft_vocab_size']:,} ({dr['shape_source']})",
        ),
        *([("MLA latent", str(dr["latent"]))] if dr.get("latent") else []),
        (
            "parameters",
            f"{_count(dr['params_total'])} ({_count(dr['params_trainable'])} trainable; "
            "embeddings frozen)",
        ),
        (
            "training memory",
            f"{fmt_gib(dr['train_memory_bytes'])} per process = weights {fmt_gib(dr['weights_bytes'])}"
            f" + grads {fmt_gib(dr['grads_bytes'])} + Adam {fmt_gib(dr['optimizer_bytes'])} + "
            f"activations {fmt_gib(dr['activation_bytes'])} ({dr['tokens_per_step']:,} tokens x "
            f"{dr['ttt_steps']} TTT steps, {dr['train_dtype']}; estimate)",
        ),
        ("device memory", fmt_gib(dr["device_memory_bytes"]) if dr["device_memory_bytes"] else "?"),
        ("checkpoint", f"{fmt_gb(dr['checkpoint_bytes'])} (weights + optimizer state)"),
    ]
    w, sv = d["target_weights"], d["serving"]
    section("serving (vLLM)")
    rows.append(
        (
            "target weights",
            f"{_count(w['params'])} parameters, {fmt_gb(w['bytes_total'])} "
            f"(quantization: {w['quantization']})",
        )
    )
    if sv:
        rows += [
            (
                "parallel",
                f"TP {sv['tensor_parallel_size']} x PP {sv['pipeline_parallel_size']} x DP "
                f"{sv['data_parallel_size']}, expert parallel {sv['expert_parallel']} "
                f"({sv['gpus_used']} of {sv['gpus_available']} GPUs)",
            ),
            (
                "per GPU",
                f"weights {fmt_gib(sv['weights_per_gpu_bytes'])} of "
                f"{fmt_gib(sv['usable_per_gpu_bytes'])} usable -> headroom "
                f"{fmt_gib(sv['headroom_per_gpu_bytes'])} for KV cache",
            ),
        ]
    else:
        rows.append(("per GPU", "n/a (cpu profile: extraction runs with transformers)"))
    section("time")
    for key in ("extract", "train"):
        e = tm[key]
        unit = "tokens" if key == "extract" else "steps"
        rows.append(
            (
                key,
                f"{fmt_duration(e['seconds'])} = {e['work']:,.0f} {unit} / {e['rate']:,.1f} per s "
                f"[{e['source']}]",
            )
        )
    section("hidden states: offline vs online (extract.mode)")
    md = d["modes"]
    off, on = md["offline"], md["online"]
    rows += [
        ("offline disk", f"{fmt_gb(off['hidden_states_bytes'])} of hidden states (kept)"),
        ("offline compute", off["gpus"]),
        (
            "online disk",
            f"0 kept; {fmt_gb(on['staging_bytes'])} in flight (the batch in "
            "training + the prefetched ones, every rank)",
        ),
        ("online compute", on["gpus"]),
    ]
    if "one_node" in on:
        one = on["one_node"]
        rows.append(
            (
                "online per GPU",
                f"vLLM {fmt_gib(one['vllm_bytes_per_gpu'])} (weights "
                f"+ {fmt_gib(EXTRACT_KV_RESERVE)} for extraction) + trainer "
                f"{fmt_gib(one['train_bytes_per_gpu'])} of {fmt_gib(one['gpu_bytes'])}"
                f" -> {'fits' if one['fits'] else 'does not fit'}",
            )
        )
    width = max(len(k) for k, v in rows if v)
    lines = [f"{k:<{width}}  {v}" if v else k for k, v in rows]
    lines.append(f"# offline\n{off['command']}")
    lines.append(f"# online\n{on['command']}")
    for cmd in on.get("stage_runs", []):
        lines.append(f"#   the train stage then runs\n{cmd}")
    if "two_nodes" in md:
        two = md["two_nodes"]
        lines.append(f"[{two['nodes']} nodes]")
        lines.append(f"# requires: {two['requires']}")
        for step, cmds in two["offline"].items():
            lines.append(f"# offline: {step}")
            lines += cmds
        lines.append(f"# online: {two['online']}")
    lines.append("[commands]")
    for key, value in d["commands"].items():
        for cmd in value if isinstance(value, list) else [value]:
            lines.append(f"# {key}\n{cmd}")
    if plan.problems:
        lines.append(f"[problems: {len(plan.problems)}]")
        lines += [f"PROBLEM {p}" for p in plan.problems]
    else:
        lines.append("[fits: no problems found]")
    return "\n".join(lines)


def main(argv: list[str] | None = None, free_fn: FreeBytesFn = free_bytes) -> int:
    parser = stage_argparser("eagle3_pipeline.tools.plan.cli", (__doc__ or "").split("\n\n")[0])
    parser.add_argument("--strict", action="store_true", help="exit 1 when any problem is found")
    parser.add_argument(
        "--out", metavar="DIR", help="write DIR/plan.json (default: <data_dir>/plan)"
    )
    args = parser.parse_intermixed_args(argv)  # options may follow the overrides
    try:
        cfg = load_config(args.overrides, params=args.params, conf_dir=args.conf_dir)
        plan = build_plan(cfg, args.overrides, free_fn=free_fn)
    except ConfigError as exc:
        print(f"error: plan: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(cfg.data_dir) / "plan"
    atomic_write_json(out / "plan.json", plan.data)
    print(render_plan(plan))
    print(f"wrote {out / 'plan.json'}")
    if plan.problems and args.strict:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
