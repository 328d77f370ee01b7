"""What preflight produces: verdicts, the stable inventory, the table, the two files.

Why two outputs with different lifetimes: the *inventory* is what downstream stages depend
on, so it holds profile-level facts only (GPU model, count, memory size, compute
capability, or "cpu") and reruns on identical nodes share DVC's cache; the *metrics* hold
the volatile readings (memory in use, processes, UUIDs, versions) and every verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.io import atomic_write_json
from eagle3_pipeline.core.metrics import write_stage_metrics
from eagle3_pipeline.preflight.record import PreflightRecord
from eagle3_pipeline.preflight.view import PreflightInputs
from eagle3_pipeline.runtime.cpu import CpuReading
from eagle3_pipeline.runtime.gpu import VisibleGpu
from eagle3_pipeline.runtime.precision import Precision, write_precision


@dataclass
class Check:
    """One verdict: ``reading`` for the table, one actionable line per problem."""

    name: str
    passed: bool
    reading: str
    problems: list[str] = field(default_factory=list)


@dataclass
class PreflightResult:
    checks: list[Check]
    mode: str  # "cpu" | "cuda"
    inventory: dict[str, Any]
    metrics: PreflightRecord
    strict: bool = True
    visible: list[VisibleGpu] = field(default_factory=list)
    target_fingerprint: dict[str, Any] | None = None  # None: the target was not found
    data_fingerprint: dict[str, Any] | None = None
    init_fingerprint: dict[str, Any] | None = None
    precision: Precision | None = None  # the choice for the later stages (runtime.precision)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def problems(self) -> list[str]:
        return [p for c in self.checks for p in c.problems]


def inventory(mode: str, visible: list[VisibleGpu], cpu: CpuReading) -> dict[str, Any]:
    """Profile-level facts only (no UUIDs, driver versions or readings): identical nodes
    and reruns with other memory use produce the same file and share DVC's cache. A CPU
    run names the CPU's native bf16 capability (what precision a CPU run can afford), not
    the CPU's model: two CPUs of one capability share the cache."""
    if mode == "cpu":
        return {"mode": "cpu", "cpu_bf16": cpu.bf16}
    groups: dict[tuple[str, int, str], int] = {}
    for v in visible:
        key = (v.info.name, v.info.memory_total_mib, v.info.cc_str)
        groups[key] = groups.get(key, 0) + 1
    return {
        "mode": "cuda",
        "gpu_count": len(visible),
        "gpus": [
            {"name": n, "memory_total_mib": m, "compute_capability": cc, "count": c}
            for (n, m, cc), c in sorted(groups.items())
        ],
    }


def _gpu_table(visible: list[VisibleGpu]) -> list[str]:
    """One row per GPU the run will use, CUDA ordinal first (NVML's index differs)."""
    lines = [f"{'cuda':>4}  {'nvml':>4}  {'name':<44} {'used / total':>22}  cc    mig  procs"]
    for v in visible:
        g = v.info
        procs = ", ".join(
            f"{p.pid}:{p.name or '?'}" + (f" {p.used_mib:,}MiB" if p.used_mib is not None else "")
            for p in g.processes
        )
        lines.append(
            f"{v.cuda_index:>4}  {g.index:>4}  {g.name[:44]:<44} "
            f"{f'{g.memory_used_mib:,} / {g.memory_total_mib:,} MiB':>22}  {g.cc_str:<5} "
            f"{'on ' if g.mig_enabled else 'off'}  {procs or '-'}"
        )
    return [*lines, ""]


def render_preflight(result: PreflightResult) -> str:
    """The table printed on success and on failure, then one line per problem."""
    lines = _gpu_table(result.visible) if result.visible else []
    width = max(len(c.name) for c in result.checks)
    fail_word = "FAIL" if result.strict else "WARN"
    for c in result.checks:
        lines.append(f"{c.name:<{width}}  {'ok  ' if c.passed else fail_word}  {c.reading}")
    problems = result.problems
    if problems:
        lines.append("")
        lines += [f"{fail_word}: {p}" for p in problems]
    verdict = "passed" if result.passed else ("FAILED" if result.strict else "passed with warnings")
    lines.append(f"preflight {verdict} (mode {result.mode}, {len(result.checks)} checks)")
    return "\n".join(lines)


def inventory_path(cfg: PreflightInputs) -> Path:
    return Path(cfg.paths.inventory)


def write_outputs(cfg: PreflightInputs, result: PreflightResult) -> None:
    atomic_write_json(inventory_path(cfg), result.inventory)
    if result.target_fingerprint is not None:
        atomic_write_json(Path(cfg.paths.target_fingerprint), result.target_fingerprint)
    if result.data_fingerprint is not None:
        atomic_write_json(Path(cfg.paths.data_fingerprint), result.data_fingerprint)
    if result.init_fingerprint is not None:
        atomic_write_json(Path(cfg.paths.init_fingerprint), result.init_fingerprint)
    if result.precision is not None:
        write_precision(cfg.paths.precision, result.precision)
    write_stage_metrics(cfg, result.metrics)
