"""The precision a run computes in where no key names one, chosen once by preflight.

Why one choice, made by preflight: data per CPU-hour is what limits a draft trained on a
CPU, and a CPU that computes bf16 natively (AMX, AVX512-BF16; :mod:`.cpu`) runs the
target's and the draft's matmuls several times faster in bf16 than in float32, while one
that does not emulates bf16 more slowly than float32. So the precision must follow the
machine, and the machine is read at run time, not when the config is composed. Preflight,
which runs first on every ``dvc repro``, writes the choice to ``paths.precision``; every
later stage depends on that file and reads it where its own key is null
(``model.dtype``; ``train.dtype`` on a CPU). The file holds the choice and its reason
only, not the CPU's model: a different CPU of the same kind changes nothing, a CPU of
another kind reruns exactly the stages whose numbers the precision changes.

The rule (:func:`default_precision`):

- a tiny target built here stays float32 everywhere: it is trained here in float32, and
  its default run must give the same figures on every machine;
- a real target (a checkpoint, a converted GGUF) computes in bf16 on GPUs and on CPUs
  with native bf16 (with float32 master weights and optimizer state when a draft trains,
  as speculators does on GPUs), and in float32 on other CPUs.

Validation's proof (vLLM's counters against our evaluator, losslessness) stays float32
on a CPU whatever this says (``validate.dtype``), where agreement is exact.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from eagle3_pipeline.core.errors import StageError
from eagle3_pipeline.core.io import atomic_write_json
from eagle3_pipeline.runtime.cpu import CpuReading

BF16 = "bfloat16"
FP32 = "float32"


@dataclass(frozen=True)
class Precision:
    """A precision and the reason it was chosen (stages' records carry it)."""

    dtype: str  # "bfloat16" or "float32" (or a key's own value: "float16")
    why: str  # one line: the key that set it, or the rule that chose it


def default_precision(device: str, tiny: bool, cpu: CpuReading | None) -> Precision:
    """The target's precision where ``model.dtype`` is null (see the module's rule);
    ``tiny``: a tiny target built here (``model.tiny`` set); ``cpu``: this machine's
    reading (None: not read, e.g. on a GPU profile)."""
    if tiny:
        return Precision(
            FP32, "a tiny target built here stays float32 (its run is reproducible anywhere)"
        )
    if device == "cuda":
        return Precision(BF16, "a real target on GPUs")
    if cpu is not None and cpu.native_bf16:
        return Precision(BF16, "a real target on a CPU that computes bf16 natively")
    return Precision(
        FP32, "a real target on a CPU without native bf16 (bf16 would be emulated, slower)"
    )


def set_by(key: str, value: object) -> Precision:
    """The precision a key names (an enum member or its text)."""
    text = str(getattr(value, "value", value))
    return Precision(text, f"{key}={text} (set)")


def chosen(key: str, value: object, default: Precision) -> Precision:
    """``key``'s own value when it is set, else ``default``."""
    return default if value is None else set_by(key, value)


def write_precision(path: str | Path, precision: Precision) -> None:
    atomic_write_json(Path(path), asdict(precision))


def read_precision(path: str | Path) -> Precision | None:
    """The choice preflight wrote, None when there is none (a stage run by hand, outside
    DVC: DVC runs no stage whose dependency is missing); a damaged file is one line."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
        return Precision(dtype=str(raw["dtype"]), why=str(raw["why"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StageError(
            f"{p}: unreadable ({type(exc).__name__}: {exc}); rerun preflight to rewrite it"
        ) from None


def rule_precision(device: str, tiny: bool, precision_file: str | Path) -> Precision:
    """The precision for keys left null: preflight's file, or -- where there is none (a
    stage or a tool run outside DVC) -- the same rule applied to this machine's CPU."""
    found = read_precision(precision_file)
    if found is not None:
        return found
    from eagle3_pipeline.runtime.cpu import read_this_cpu

    here = default_precision(device, tiny, read_this_cpu() if device == "cpu" else None)
    return Precision(here.dtype, f"{here.why} (chosen here: no {Path(precision_file).name})")


def model_precision(
    model_dtype: object, device: str, tiny: bool, precision_file: str | Path
) -> Precision:
    """The target's precision: ``model.dtype`` when set (the file is not read), else
    :func:`rule_precision`."""
    if model_dtype is not None:
        return set_by("model.dtype", model_dtype)
    return rule_precision(device, tiny, precision_file)
