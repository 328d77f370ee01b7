"""The CPU's bf16 capability: from the kernel's CPU flags, cross-checked with torch.

Why preflight reads it: on a CPU that computes bf16 natively (AMX tiles, or AVX512-BF16)
bf16 matmuls of a draft's and a target's shapes run 5-15x faster than float32, while on
one that does not (AVX2, AVX-512 without BF16) torch emulates them and bf16 is slower than
float32. The precision a CPU run may use therefore follows the CPU, not a flag a user has
to know about, and the machines this pipeline runs on differ from run to run (AMD EPYC
without AMX, Intel Xeon with it).

Why two sources: ``/proc/cpuinfo``'s flags say what the silicon has and the kernel
exposes; torch says what its own kernels will dispatch to (AMX also needs the kernel's
permission for the tile state, which torch requests in ``torch.cpu._init_amx``; a
container or an old kernel can refuse it while the flag is listed). The capability kept
is the lower of the two, and a disagreement is recorded with what each said. Either source
may be missing (no ``/proc`` on macOS, no torch in a bare environment): the other decides,
and the note says so.

Everything but :func:`read_this_cpu` is a pure function of what the platform reports, so
tests state a platform instead of reading the machine they run on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Bf16 = Literal["amx", "avx512_bf16", "none"]
# best first: a capability implies those after it (AMX CPUs all have AVX512-BF16)
_ORDER: tuple[Bf16, ...] = ("amx", "avx512_bf16", "none")
# the flags that decide (and the vector width torch's float32 kernels will use)
RELEVANT_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2")
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class TorchCpuView:
    """What torch reports of the CPU (its kernels dispatch on this, not on the flags)."""

    capability: str | None  # torch.backends.cpu.get_cpu_capability(): AVX512, AVX2, ...
    amx: bool | None  # AMX tiles usable (supported, and the kernel granted the tile state)
    avx512_bf16: bool | None  # AVX512-BF16 instructions usable
    error: str | None = None  # why torch could not be asked, None when it could


@dataclass(frozen=True)
class CpuReading:
    """The CPU as preflight records it, and the bf16 capability both sources agree on."""

    model: str | None  # /proc/cpuinfo's "model name", None when unreadable
    vendor: str | None  # /proc/cpuinfo's "vendor_id" (GenuineIntel, AuthenticAMD)
    flags: list[str] | None  # the RELEVANT_FLAGS present; None: /proc/cpuinfo unreadable
    torch: TorchCpuView  # torch's own report
    bf16: Bf16  # native bf16 compute: "amx", "avx512_bf16" or "none"
    note: str | None  # why the flags and torch disagree, or which one was missing
    # the cores this process may run on (its affinity): what a run's CPU-hours multiply
    # its wall time by; None where it was not read
    cores: int | None = None

    @property
    def native_bf16(self) -> bool:
        """bf16 matmuls run natively (faster than float32) on this CPU."""
        return self.bf16 != "none"

    def describe(self) -> str:
        """One line for preflight's table."""
        name = self.model or "unknown CPU"
        word = {"amx": "AMX + AVX512-BF16", "avx512_bf16": "AVX512-BF16", "none": "none"}
        return f"{name}; native bf16: {word[self.bf16]}" + (f" ({self.note})" if self.note else "")


def parse_cpuinfo(text: str) -> tuple[str | None, str | None, set[str]]:
    """``model name``, ``vendor_id`` and the flags of the first processor listed (the
    cores of one machine share them)."""
    model = vendor = None
    flags: set[str] = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if model is not None and not line.strip():
                break  # the end of the first processor's block
            continue
        key, value = key.strip(), value.strip()
        if key == "model name" and model is None:
            model = value
        elif key == "vendor_id" and vendor is None:
            vendor = value
        elif key == "flags" and not flags:
            flags = set(value.split())
    return model, vendor, flags


def bf16_from_flags(flags: set[str]) -> Bf16:
    """The capability the CPU flags list: AMX needs both its tile and its bf16 unit."""
    if {"amx_tile", "amx_bf16"} <= flags:
        return "amx"
    return "avx512_bf16" if "avx512_bf16" in flags else "none"


def bf16_from_torch(view: TorchCpuView) -> Bf16 | None:
    """The capability torch reports, None when it could not be asked."""
    if view.error is not None or view.amx is None or view.avx512_bf16 is None:
        return None
    if view.amx:
        return "amx"
    return "avx512_bf16" if view.avx512_bf16 else "none"


def read_cpu(cpuinfo: str | None, view: TorchCpuView, cores: int | None = None) -> CpuReading:
    """The reading from ``/proc/cpuinfo``'s text (None: unreadable), torch's view and the
    cores the process may use."""
    model = vendor = None
    flags: set[str] | None = None
    if cpuinfo is not None:
        model, vendor, flags = parse_cpuinfo(cpuinfo)
    by_flags = bf16_from_flags(flags) if flags else None
    by_torch = bf16_from_torch(view)
    note = None
    if by_flags is None and by_torch is None:
        bf16: Bf16 = "none"
        note = "neither /proc/cpuinfo nor torch could be read: assumed none"
    elif by_flags is None:
        bf16 = by_torch or "none"
        note = "no CPU flags (/proc/cpuinfo unreadable): torch's report decides"
    elif by_torch is None:
        bf16 = by_flags
        note = f"torch could not be asked ({view.error or 'no report'}): the CPU flags decide"
    else:
        bf16 = max(by_flags, by_torch, key=_ORDER.index)  # the lower of the two
        if by_flags != by_torch:
            note = f"the CPU flags say {by_flags}, torch says {by_torch}: {bf16} kept"
    present = sorted(f for f in RELEVANT_FLAGS if f in flags) if flags is not None else None
    return CpuReading(model, vendor, present, view, bf16, note, cores)


def torch_cpu_view() -> TorchCpuView:
    """Ask the installed torch (its private CPU probes: a test fails when they go)."""
    try:
        import torch
    except ImportError as exc:
        return TorchCpuView(None, None, None, f"torch is not importable: {exc}")
    try:
        capability = str(torch.backends.cpu.get_cpu_capability())
        # _init_amx asks the kernel for the AMX tile state; False where it is refused
        amx = bool(torch.cpu._is_amx_tile_supported() and torch.cpu._init_amx())
        avx512_bf16 = bool(torch.cpu._is_avx512_bf16_supported())
    except (AttributeError, RuntimeError) as exc:
        return TorchCpuView(None, None, None, f"{type(exc).__name__}: {exc}")
    return TorchCpuView(capability, amx, avx512_bf16)


def read_this_cpu(cpuinfo: Path = CPUINFO) -> CpuReading:
    """This machine's reading (the only function here that looks at the machine)."""
    try:
        text: str | None = cpuinfo.read_text(errors="replace")
    except OSError:
        text = None
    return read_cpu(text, torch_cpu_view(), usable_cores())


def usable_cores() -> int | None:
    """The cores this process may run on (a container's or taskset's limit, not the
    machine's count where the affinity call exists)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()
