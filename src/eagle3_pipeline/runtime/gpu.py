"""GPU inventory through NVML, behind a small reader interface.

Why a reader interface: no NVML simulator exists, and the machines that develop this code
have no driver. All logic (which GPUs a run will use, whether they are idle, whether
memory went back after training) works on plain :class:`GpuInfo` records that a
:class:`NvmlReader` produces; :class:`PynvmlReader` is the only code that talks to the
driver, and :class:`MemoryReader` reproduces machines in tests.

Why this module computes visibility itself: NVML enumerates every GPU of the node in PCI
bus order and ignores ``CUDA_VISIBLE_DEVICES``, while CUDA (torch, vLLM) numbers only the
visible ones, in ``CUDA_DEVICE_ORDER`` (default ``FASTEST_FIRST``). A check of "the GPUs
this run will use" must apply the same rules, or it checks the wrong cards.

Nothing here imports torch; ``pynvml`` (from ``nvidia-ml-py``) is imported lazily.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

MIB = 1024 * 1024

COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}

# Every pynvml attribute PynvmlReader touches: a test checks they exist in the installed
# nvidia-ml-py, so an API change fails loudly here rather than on a GPU machine.
PYNVML_API = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetProcessName",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetComputeRunningProcesses",
    "NVMLError",
    "NVMLError_LibraryNotFound",
    "NVMLError_DriverNotLoaded",
    "NVMLError_NotSupported",
    "NVMLError_NotFound",
    "NVML_DEVICE_MIG_ENABLE",
)


class GpuError(RuntimeError):
    """A GPU-side problem a user must fix; the message names the GPU or the variable."""


class NoGpuDriver(GpuError):
    """NVML cannot be used on this machine (no library, no driver): CPU mode."""


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU, as NVML lists it."""

    pid: int  # its process id (in the driver's namespace: another container's may differ)
    name: str | None  # None when neither NVML nor /proc can tell (another container)
    used_mib: int | None  # None when the driver does not report it (e.g. under MIG)

    def label(self) -> str:
        return f"pid {self.pid} ({self.name or 'name unknown'})"


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as NVML reports it. ``index`` is NVML's (PCI bus order)."""

    index: int
    name: str
    uuid: str
    memory_total_mib: int
    memory_used_mib: int
    compute_capability: tuple[int, int]
    mig_enabled: bool = False
    compute_mode: str = "default"
    processes: tuple[GpuProcess, ...] = ()
    pci_bus_id: str = ""
    mig_uuids: tuple[str, ...] = ()

    @property
    def cc(self) -> float:
        major, minor = self.compute_capability
        return major + minor / 10

    @property
    def cc_str(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"


@dataclass(frozen=True)
class VisibleGpu:
    """A GPU the run will use: its CUDA ordinal (what torch calls ``cuda:N``) and its
    NVML record; ``mig_uuid`` when ``CUDA_VISIBLE_DEVICES`` selected a MIG instance."""

    cuda_index: int
    info: GpuInfo
    mig_uuid: str | None = None

    @property
    def label(self) -> str:
        """How messages name it: the CUDA ordinal, plus the NVML index when they differ."""
        if self.cuda_index == self.info.index:
            return f"GPU {self.cuda_index}"
        return f"GPU {self.cuda_index} (NVML index {self.info.index})"


# --------------------------------------------------------------------------- readers


@runtime_checkable
class NvmlReader(Protocol):
    """What the checks need from NVML; implemented by :class:`PynvmlReader` and
    :class:`MemoryReader`."""

    def driver_version(self) -> str: ...

    def cuda_driver_version(self) -> str: ...

    def device_count(self) -> int: ...

    def device(self, index: int) -> GpuInfo: ...


@dataclass
class MemoryReader:
    """An in-memory machine for tests: the GPUs are given, nothing is read."""

    gpus: list[GpuInfo] = field(default_factory=list)
    driver: str = "575.57.08"
    cuda: str = "12.9"

    def driver_version(self) -> str:
        return self.driver

    def cuda_driver_version(self) -> str:
        return self.cuda

    def device_count(self) -> int:
        return len(self.gpus)

    def device(self, index: int) -> GpuInfo:
        return self.gpus[index]


def _text(value: Any) -> str:
    """pynvml returned bytes before 11.5 and str since; accept both."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _proc_comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


class PynvmlReader:
    """The real reader over ``pynvml``. Construct it through :func:`open_reader`."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass

    def driver_version(self) -> str:
        return _text(self._nvml.nvmlSystemGetDriverVersion())

    def cuda_driver_version(self) -> str:
        v = int(self._nvml.nvmlSystemGetCudaDriverVersion())  # e.g. 12090
        return f"{v // 1000}.{(v % 1000) // 10}"

    def device_count(self) -> int:
        return int(self._nvml.nvmlDeviceGetCount())

    def _optional(self, fn: str, *args: Any, default: Any = None) -> Any:
        """Calls some drivers or GPUs do not support (MIG on GeForce, process names in a
        container) must not fail the inventory."""
        try:
            return getattr(self._nvml, fn)(*args)
        except self._nvml.NVMLError:
            return default

    def _process_name(self, pid: int) -> str | None:
        name = self._optional("nvmlSystemGetProcessName", pid)
        if name:
            return Path(_text(name)).name
        return _proc_comm(pid)

    def device(self, index: int) -> GpuInfo:
        n = self._nvml
        h = n.nvmlDeviceGetHandleByIndex(index)
        mem = n.nvmlDeviceGetMemoryInfo(h)
        major, minor = n.nvmlDeviceGetCudaComputeCapability(h)
        mig = self._optional("nvmlDeviceGetMigMode", h, default=(0, 0))
        mig_on = bool(mig and mig[0] == n.NVML_DEVICE_MIG_ENABLE)
        mig_uuids: list[str] = []
        if mig_on:
            for i in range(int(self._optional("nvmlDeviceGetMaxMigDeviceCount", h, default=0))):
                mh = self._optional("nvmlDeviceGetMigDeviceHandleByIndex", h, i)
                if mh is not None:
                    mig_uuids.append(_text(n.nvmlDeviceGetUUID(mh)))
        procs = []
        for p in self._optional("nvmlDeviceGetComputeRunningProcesses", h, default=[]) or []:
            used = getattr(p, "usedGpuMemory", None)
            procs.append(
                GpuProcess(
                    pid=int(p.pid),
                    name=self._process_name(int(p.pid)),
                    used_mib=None if used is None else int(used) // MIB,
                )
            )
        pci = self._optional("nvmlDeviceGetPciInfo", h)
        mode = self._optional("nvmlDeviceGetComputeMode", h, default=0)
        return GpuInfo(
            index=index,
            name=_text(n.nvmlDeviceGetName(h)),
            uuid=_text(n.nvmlDeviceGetUUID(h)),
            memory_total_mib=int(mem.total) // MIB,
            memory_used_mib=int(mem.used) // MIB,
            compute_capability=(int(major), int(minor)),
            mig_enabled=mig_on,
            compute_mode=COMPUTE_MODES.get(int(mode), str(mode)),
            processes=tuple(procs),
            pci_bus_id=_text(pci.busId) if pci is not None else "",
            mig_uuids=tuple(mig_uuids),
        )


def open_reader() -> PynvmlReader:
    """Initialise NVML; raise :class:`NoGpuDriver` (CPU mode) when it cannot be used."""
    try:
        import pynvml
    except ImportError as exc:  # nvidia-ml-py is a dependency; treat its absence as no GPU
        raise NoGpuDriver(f"pynvml is not importable ({exc}): install nvidia-ml-py") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        raise NoGpuDriver("no NVIDIA driver: the NVML library was not found") from None
    except pynvml.NVMLError_DriverNotLoaded:
        raise NoGpuDriver("the NVIDIA driver is not loaded (NVML present, no driver)") from None
    except pynvml.NVMLError as exc:
        raise NoGpuDriver(f"NVML failed to initialise: {exc}") from None
    return PynvmlReader(pynvml)


# --------------------------------------------------------------------------- visibility


def read_all(reader: NvmlReader) -> list[GpuInfo]:
    return [reader.device(i) for i in range(reader.device_count())]


def cuda_order(gpus: list[GpuInfo], device_order: str | None) -> list[GpuInfo]:
    """The order CUDA numbers devices in before ``CUDA_VISIBLE_DEVICES`` applies.

    ``PCI_BUS_ID`` is NVML's own order. ``FASTEST_FIRST`` (CUDA's default) puts the most
    capable device first; NVML cannot see CUDA's exact speed heuristic, so this sorts by
    compute capability then memory, keeping PCI order among equals -- exact for the
    homogeneous nodes this pipeline targets, an approximation on mixed ones.
    """
    order = (device_order or "FASTEST_FIRST").strip().upper()
    by_pci = sorted(gpus, key=lambda g: (g.pci_bus_id.lower(), g.index))
    if order == "PCI_BUS_ID":
        return by_pci
    if order != "FASTEST_FIRST":
        raise GpuError(f"CUDA_DEVICE_ORDER={device_order!r} is not FASTEST_FIRST or PCI_BUS_ID")
    return sorted(by_pci, key=lambda g: (-g.cc, -g.memory_total_mib))


def _match_mig(token: str, gpus: list[GpuInfo]) -> tuple[GpuInfo, str | None]:
    """Resolve a ``MIG-...`` entry, the legacy ``MIG-GPU-<uuid>/<gi>/<ci>`` spelling too."""
    t = token.lower()
    hits = [(g, u) for g in gpus for u in g.mig_uuids if u.lower().startswith(t)]
    if not hits and t.startswith("mig-gpu-"):
        parent = t.removeprefix("mig-").split("/")[0]
        hits = [(g, token) for g in gpus if g.uuid.lower().startswith(parent)]
    if len(hits) == 1:
        return hits[0]
    what = "matches no MIG device" if not hits else "is ambiguous"
    raise GpuError(f"CUDA_VISIBLE_DEVICES entry {token!r} {what}")


def _match_uuid(token: str, gpus: list[GpuInfo]) -> tuple[GpuInfo, str | None]:
    """Resolve a ``GPU-...`` / ``MIG-...`` entry (a unique prefix is enough, as in CUDA)."""
    t = token.lower()
    if t.startswith("mig-"):
        return _match_mig(token, gpus)
    if not t.startswith("gpu-"):
        t = "gpu-" + t
    hits_g = [g for g in gpus if g.uuid.lower().startswith(t)]
    if len(hits_g) == 1:
        return hits_g[0], None
    what = "matches no GPU UUID" if not hits_g else "is ambiguous (several GPUs share the prefix)"
    raise GpuError(f"CUDA_VISIBLE_DEVICES entry {token!r} {what}")


def select_visible(
    gpus: list[GpuInfo], visible: str | None, device_order: str | None = None
) -> list[VisibleGpu]:
    """The GPUs a CUDA process started with these variables sees, numbered as it sees them.

    Follows the CUDA runtime's rules: unset means all devices; an empty value means none;
    entries are ordinals (in ``CUDA_DEVICE_ORDER``), GPU UUIDs or MIG UUIDs, UUIDs may be
    abbreviated to a unique prefix; the list ends at the first invalid ordinal (CUDA
    silently ignores the rest); a device listed twice makes CUDA fail, so it is an error.
    """
    ordered = cuda_order(gpus, device_order)
    if visible is None:
        return [VisibleGpu(i, g) for i, g in enumerate(ordered)]
    picked: list[tuple[GpuInfo, str | None]] = []
    for raw in visible.split(","):
        token = raw.strip()
        if not token:
            break
        if token.lstrip("-").isdigit():
            k = int(token)
            if not 0 <= k < len(ordered):
                break
            picked.append((ordered[k], None))
        else:
            picked.append(_match_uuid(token, gpus))
    seen: set[tuple[int, str | None]] = set()
    for g, mig in picked:
        key = (g.index, mig)
        if key in seen:
            raise GpuError(
                f"CUDA_VISIBLE_DEVICES={visible!r} lists GPU {g.index} twice: CUDA then fails"
            )
        seen.add(key)
    return [VisibleGpu(i, g, mig) for i, (g, mig) in enumerate(picked)]


def visible_gpus(reader: NvmlReader, env: Mapping[str, str] | None = None) -> list[VisibleGpu]:
    env = os.environ if env is None else env
    return select_visible(
        read_all(reader), env.get("CUDA_VISIBLE_DEVICES"), env.get("CUDA_DEVICE_ORDER")
    )


# --------------------------------------------------------------------------- snapshots


@dataclass(frozen=True)
class GpuReading:
    """One visible GPU as preflight's record keeps it: NVML's reading (:class:`GpuInfo`)
    with the compute capability as text, and where the run sees it (CUDA ordinal, MIG)."""

    index: int  # NVML's index (PCI bus order), not the CUDA ordinal
    name: str  # the product name, e.g. NVIDIA H200
    uuid: str  # NVML's GPU UUID
    memory_total_mib: int  # the GPU's memory
    memory_used_mib: int  # memory in use when preflight read it
    compute_capability: str  # major.minor, e.g. 9.0
    mig_enabled: bool  # MIG mode is on
    compute_mode: str  # default, exclusive_process, ... (NVML's compute mode)
    processes: list[GpuProcess]  # the processes holding memory on it
    pci_bus_id: str  # NVML's PCI bus id, '' when it cannot tell
    mig_uuids: list[str]  # its MIG instances' UUIDs (MIG mode only)
    cuda_index: int  # the CUDA ordinal the run sees it as (torch's cuda:N)
    mig_uuid: str | None  # the MIG instance CUDA_VISIBLE_DEVICES selected, None: the GPU


def gpu_reading(v: VisibleGpu) -> GpuReading:
    """The volatile per-GPU reading written to metrics (UUIDs and memory in use)."""
    g = v.info
    return GpuReading(
        index=g.index,
        name=g.name,
        uuid=g.uuid,
        memory_total_mib=g.memory_total_mib,
        memory_used_mib=g.memory_used_mib,
        compute_capability=g.cc_str,
        mig_enabled=g.mig_enabled,
        compute_mode=g.compute_mode,
        processes=list(g.processes),
        pci_bus_id=g.pci_bus_id,
        mig_uuids=list(g.mig_uuids),
        cuda_index=v.cuda_index,
        mig_uuid=v.mig_uuid,
    )


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory in use and the processes holding it, at one moment."""

    cuda_index: int  # torch's ``cuda:N``
    uuid: str  # NVML's, stable across CUDA_VISIBLE_DEVICES orderings
    memory_used_mib: int  # memory in use at that moment
    processes: list[GpuProcess]  # the processes holding memory on it then


@dataclass(frozen=True)
class GpuSnapshot:
    """GPU memory in use and by which processes, for the GPUs a run uses: preflight's
    record keeps one, and train compares it with another taken after its workers exit."""

    mode: str  # cuda, or cpu when there is no driver
    gpus: list[GpuMemory]  # per GPU the run uses, in CUDA order
    reason: str | None = field(default=None, metadata={"optional": True})  # cpu: why


@dataclass(frozen=True)
class GpuRelease:
    """Whether training gave its GPUs back: NVML after the workers exited, compared with
    preflight's snapshot. ``mode`` is ``not applicable`` on CPU, with the reason."""

    mode: str  # cuda or not applicable
    reason: str | None = field(default=None, metadata={"optional": True})  # why not applicable
    # NVML right after the training workers exited (cuda only)
    after_workers_exit: GpuSnapshot | None = field(default=None, metadata={"optional": True})
    # preflight's snapshot was there to compare with
    compared_with_preflight: bool | None = field(default=None, metadata={"optional": True})
    clean: bool | None = field(default=None, metadata={"optional": True})  # None: unchecked
    problems: list[str] = field(default_factory=list)  # one line per GPU not given back


def gpu_memory(visible: list[VisibleGpu]) -> list[GpuMemory]:
    """Memory in use on each of these GPUs, and by which processes, as NVML read them:
    what :func:`snapshot` and preflight's record keep."""
    return [
        GpuMemory(v.cuda_index, v.info.uuid, v.info.memory_used_mib, list(v.info.processes))
        for v in visible
    ]


def snapshot(reader: NvmlReader | None = None, env: Mapping[str, str] | None = None) -> GpuSnapshot:
    """GPU memory in use now, and by which processes, for the GPUs this run uses.

    Preflight stores one in its metrics; the train stage takes another right after its
    workers exit and compares the two with :func:`compare_snapshots`. Without a driver
    the snapshot says ``mode: cpu``.
    """
    own = None
    if reader is None:
        try:
            reader = own = open_reader()
        except NoGpuDriver as exc:
            return GpuSnapshot(mode="cpu", gpus=[], reason=str(exc))
    try:
        return GpuSnapshot(mode="cuda", gpus=gpu_memory(visible_gpus(reader, env)))
    finally:
        if own is not None:
            own.close()


def _who(procs: list[GpuProcess]) -> str:
    return ", ".join(
        p.label() + (f" {p.used_mib:,} MiB" if p.used_mib is not None else "") for p in procs
    )


def compare_snapshots(
    before: GpuSnapshot, after: GpuSnapshot, tolerance_mib: int = 256
) -> list[str]:
    """One line per GPU whose memory did not go back to ``before`` (within tolerance) or
    that has a process now which it did not have before. Empty: the GPUs are clean."""
    problems: list[str] = []
    if after.mode != "cuda" or before.mode != "cuda":
        return problems
    old = {g.uuid: g for g in before.gpus}
    for g in after.gpus:
        prev = old.get(g.uuid)
        base = prev.memory_used_mib if prev else 0
        known = {p.pid for p in prev.processes} if prev else set()
        new = [p for p in g.processes if p.pid not in known]
        grown = g.memory_used_mib - base
        if grown <= tolerance_mib and not new:
            continue
        who = _who(new)
        line = f"GPU {g.cuda_index}: {g.memory_used_mib:,} MiB in use, {base:,} MiB at preflight"
        problems.append(line + (f"; still running: {who}" if who else ""))
    return problems
