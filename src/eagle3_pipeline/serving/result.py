"""What one vLLM engine run gives back, typed once where it crosses into this process.

Why: the offline worker (in the vLLM environment) and the served path (over HTTP) both
report a run as JSON-like dicts (:func:`eagle3_pipeline.serving.counters.generation_run`).
Read as dicts everywhere, a key renamed on one side surfaced as a ``KeyError`` deep in the
figures, or, through ``.get``, as a figure silently missing from the report. Here the run
is parsed once (:meth:`VllmRun.parse`): a missing or mistyped key is one line naming the
source and the key, and every reader after it gets attributes a type checker follows.

The counters stay the plain reading :mod:`eagle3_pipeline.serving.counters` defines
(``{"drafts", "draft_tokens", "accepted", "accepted_per_pos"}`` or ``{}``): the worker sums
and subtracts them in the vLLM environment with the standard library alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# A spec-decode counter reading (see the module's docstring); ``{}``: speculation was off.
Counters = dict[str, Any]


class VllmResultError(ValueError):
    """A vLLM run's result without a key it must have, or with a value of another type."""


def _get(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], source: str) -> Any:
    if key not in data:
        raise VllmResultError(f"{source}: the vLLM run's result has no {key!r}")
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise VllmResultError(
            f"{source}: the vLLM run's {key!r} is {type(value).__name__}, not "
            + (kind.__name__ if isinstance(kind, type) else " or ".join(t.__name__ for t in kind))
        )
    return value


def _opt_float(data: Mapping[str, Any], key: str, source: str) -> float | None:
    if data.get(key) is None:
        return None
    return float(_get(data, key, (int, float), source))


@dataclass(frozen=True)
class GenerationPass:
    """One measured decoding of the prompts on a loaded engine."""

    outputs: list[list[int]]  # the token ids generated per prompt of the pass, in order
    generated_tokens: int  # their total
    wall_s: float  # the generation's wall time (engine load and counter reads excluded)
    tokens_per_s: float | None  # generated_tokens / wall_s; None when nothing was timed
    counters: Counters  # vLLM's spec-decode counters accumulated during the pass
    # the counters per prompt label (a pass run with labels: one label's prompts at a time)
    group_counters: dict[str, Counters] = field(default_factory=dict)
    latencies_s: list[float] | None = None  # per prompt, single-stream passes only
    concurrency: int = 1  # requests in flight

    @classmethod
    def parse(cls, data: Mapping[str, Any], source: str) -> GenerationPass:
        """The pass in ``data`` (a worker's or the served path's dict); ``source`` names it
        in errors."""
        return cls(**_pass_fields(data, source))


def _pass_fields(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    outputs = _get(data, "outputs", list, source)
    latencies = data.get("latencies_s")
    return {
        "outputs": [[int(t) for t in o] for o in outputs],
        "generated_tokens": int(_get(data, "generated_tokens", int, source)),
        "wall_s": float(_get(data, "wall_s", (int, float), source)),
        "tokens_per_s": _opt_float(data, "tokens_per_s", source),
        "counters": dict(_get(data, "counters", dict, source)),
        "group_counters": {str(k): dict(v) for k, v in (data.get("group_counters") or {}).items()},
        "latencies_s": None if latencies is None else [float(x) for x in latencies],
        "concurrency": int(data.get("concurrency") or 1),
    }


@dataclass(frozen=True)
class VllmRun(GenerationPass):
    """One engine's run: its main pass (the fields inherited), the further passes over the
    same prompts on the same engine, and the engine's own timings and setup."""

    passes: dict[str, GenerationPass] = field(default_factory=dict)
    load_s: float | None = None  # the engine's start (model load, compilation)
    import_s: float | None = None  # importing vLLM (offline worker only)
    run_s: float | None = None  # the whole process or server's wall time
    env: dict[str, str] = field(default_factory=dict)  # the VLLM_* variables it ran with
    # what our vLLM plugins patched in that engine (the offline worker reports it)
    vllm_patches: list[str] | None = None

    @classmethod
    def parse(cls, data: Mapping[str, Any], source: str) -> VllmRun:
        passes = data.get("passes") or {}
        if not isinstance(passes, Mapping):
            raise VllmResultError(f"{source}: the vLLM run's 'passes' is not a mapping")
        patches = data.get("vllm_patches")
        return cls(
            **_pass_fields(data, source),
            passes={
                str(name): GenerationPass.parse(p, f"{source}, pass {name}")
                for name, p in passes.items()
            },
            load_s=_opt_float(data, "load_s", source),
            import_s=_opt_float(data, "import_s", source),
            run_s=_opt_float(data, "run_s", source),
            env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
            vllm_patches=None if patches is None else [str(p) for p in patches],
        )
