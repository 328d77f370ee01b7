"""NVML reader, CUDA visibility rules and memory snapshots (eagle3_pipeline.runtime.gpu)."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
from machines import BLACKWELL, rtx

from eagle3_pipeline.runtime import gpu
from eagle3_pipeline.runtime.gpu import (
    GpuError,
    GpuInfo,
    GpuProcess,
    GpuSnapshot,
    MemoryReader,
    NoGpuDriver,
    compare_snapshots,
    select_visible,
    snapshot,
)


def machine(n: int = 8) -> list[GpuInfo]:
    return [rtx(i) for i in range(n)]


# --------------------------------------------------------------------------- visibility


def test_unset_means_all_in_pci_order():
    vis = select_visible(machine(), None)
    assert [v.cuda_index for v in vis] == list(range(8))
    assert [v.info.index for v in vis] == list(range(8))


def test_empty_means_none():
    assert select_visible(machine(), "") == []


def test_subset_by_index_renumbers_from_zero():
    vis = select_visible(machine(), "5,2")
    assert [(v.cuda_index, v.info.index) for v in vis] == [(0, 5), (1, 2)]
    assert vis[0].label == "GPU 0 (NVML index 5)"


def test_invalid_ordinal_ends_the_list_like_cuda():
    assert [v.info.index for v in select_visible(machine(), "0,1,-1,2")] == [0, 1]
    assert [v.info.index for v in select_visible(machine(), "3,9,4")] == [3]


def test_subset_by_full_uuid_and_by_prefix():
    gpus = machine()
    vis = select_visible(gpus, f"{gpus[6].uuid},GPU-03aa")
    assert [v.info.index for v in vis] == [6, 3]
    # without the GPU- prefix, as CUDA also accepts
    assert select_visible(gpus, "07aa1b2c")[0].info.index == 7


def test_ambiguous_or_unknown_uuid_is_an_error():
    with pytest.raises(GpuError, match="ambiguous"):
        select_visible(machine(), "GPU-0")
    with pytest.raises(GpuError, match="matches no GPU UUID"):
        select_visible(machine(), "GPU-ffff")


def test_duplicate_device_is_an_error():
    with pytest.raises(GpuError, match="twice"):
        select_visible(machine(), "1,1")


def test_mig_uuid_selects_its_parent_gpu():
    gpus = machine()
    gpus[4] = dataclasses.replace(
        gpus[4], mig_enabled=True, mig_uuids=("MIG-4f3e2d1c-aaaa-bbbb-cccc-000000000001",)
    )
    (v,) = select_visible(gpus, "MIG-4f3e2d1c")
    assert v.info.index == 4 and v.mig_uuid.startswith("MIG-4f3e2d1c")
    with pytest.raises(GpuError, match="no MIG device"):
        select_visible(gpus, "MIG-0000")


def test_device_order_fastest_first_vs_pci_bus_id():
    old = dataclasses.replace(
        rtx(0), name="NVIDIA A100-SXM4-80GB", compute_capability=(8, 0), memory_total_mib=81920
    )
    new = dataclasses.replace(rtx(1), name="NVIDIA H200", compute_capability=(9, 0))
    gpus = [old, new]  # NVML (PCI) order: the A100 first
    assert select_visible(gpus, "0", "PCI_BUS_ID")[0].info.name == "NVIDIA A100-SXM4-80GB"
    assert select_visible(gpus, "0", "FASTEST_FIRST")[0].info.name == "NVIDIA H200"
    assert select_visible(gpus, "0")[0].info.name == "NVIDIA H200"  # CUDA's default
    with pytest.raises(GpuError, match="CUDA_DEVICE_ORDER"):
        select_visible(gpus, None, "SLOWEST_FIRST")


# --------------------------------------------------------------------------- snapshots


def test_snapshot_and_compare_clean_vs_leftover():
    reader = MemoryReader(machine(2))
    before = snapshot(reader, env={})
    assert before.mode == "cuda" and [g.memory_used_mib for g in before.gpus] == [0, 0]
    assert compare_snapshots(before, snapshot(reader, env={})) == []

    leftover = GpuProcess(pid=4242, name="python", used_mib=30_000)
    after_reader = MemoryReader([rtx(0), rtx(1, used=30_512, procs=(leftover,))])
    problems = compare_snapshots(before, snapshot(after_reader, env={}))
    assert problems == [
        "GPU 1: 30,512 MiB in use, 0 MiB at preflight; still running: pid 4242 (python) 30,000 MiB"
    ]


def test_compare_flags_memory_growth_without_a_visible_process():
    before = snapshot(MemoryReader(machine(1)), env={})
    after = snapshot(MemoryReader([rtx(0, used=5000)]), env={})
    assert compare_snapshots(before, after) == ["GPU 0: 5,000 MiB in use, 0 MiB at preflight"]
    assert compare_snapshots(before, after, tolerance_mib=6000) == []


def test_snapshot_honours_cuda_visible_devices():
    snap = snapshot(MemoryReader(machine()), env={"CUDA_VISIBLE_DEVICES": "7"})
    assert [g.uuid for g in snap.gpus] == [machine()[7].uuid]


def test_compare_is_silent_in_cpu_mode():
    cpu = GpuSnapshot(mode="cpu", gpus=[], reason="no driver")
    assert compare_snapshots(cpu, cpu) == []


def test_snapshots_round_trip_through_the_records_json(tmp_path):
    """The preflight record stores the snapshot as JSON; train reads it back as the same
    typed snapshot (processes included) and compares with it."""
    from record_samples import preflight_record

    from eagle3_pipeline.preflight.record import PreflightRecord

    leftover = GpuProcess(pid=4242, name=None, used_mib=None)
    snap = snapshot(MemoryReader([rtx(0, used=700, procs=(leftover,))]), env={})
    path = tmp_path / "preflight.json"
    preflight_record(mode="cuda", snapshot=snap).write(path)
    read = PreflightRecord.read(path).snapshot
    assert read == snap and isinstance(read.gpus[0].processes[0], GpuProcess)
    assert "reason" not in json.loads(path.read_text())["snapshot"]  # optional, unset


# --------------------------------------------------------------------------- real pynvml


def _driver_present() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_every_pynvml_name_the_adapter_uses_exists():
    import pynvml

    missing = [name for name in gpu.PYNVML_API if not hasattr(pynvml, name)]
    assert missing == []
    assert pynvml.NVML_DEVICE_MIG_ENABLE == 1


def test_real_library_without_driver_is_cpu_mode():
    if _driver_present():
        pytest.skip("an NVIDIA driver is present: the driverless path cannot be exercised")
    with pytest.raises(NoGpuDriver, match="driver"):
        gpu.open_reader()
    snap = snapshot()
    assert snap.mode == "cpu" and snap.gpus == [] and snap.reason


class _FakeNvml:
    """pynvml's surface as PynvmlReader uses it, for one Blackwell GPU with two processes:
    exercises the conversions (bytes names, None memory, unsupported MIG, /proc fallback)."""

    class NVMLError(Exception):
        pass

    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self) -> None:
        self.shutdown = False

    def nvmlSystemGetDriverVersion(self):
        return b"575.57.08"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12090

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("h", i)

    def nvmlDeviceGetName(self, h):
        return BLACKWELL.encode()

    def nvmlDeviceGetUUID(self, h):
        return "GPU-01234567-89ab-cdef-0123-456789abcdef"

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=97887 * gpu.MIB, used=41210 * gpu.MIB, free=0)

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return (12, 0)

    def nvmlDeviceGetMigMode(self, h):
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetComputeMode(self, h):
        return 3

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=b"00000000:18:00.0")

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [
            SimpleNamespace(pid=8812, usedGpuMemory=41000 * gpu.MIB),
            SimpleNamespace(pid=1, usedGpuMemory=None),
        ]

    def nvmlSystemGetProcessName(self, pid):
        if pid == 8812:
            return b"/usr/bin/python"
        raise self.NVMLError("No Permission")

    def nvmlShutdown(self):
        self.shutdown = True


def test_pynvml_reader_conversions():
    fake = _FakeNvml()
    reader = gpu.PynvmlReader(fake)
    assert isinstance(reader, gpu.NvmlReader)
    assert reader.driver_version() == "575.57.08"
    assert reader.cuda_driver_version() == "12.9"
    info = reader.device(0)
    assert info.name == BLACKWELL and info.uuid.startswith("GPU-0123")
    assert (info.memory_total_mib, info.memory_used_mib) == (97887, 41210)
    assert info.cc_str == "12.0" and not info.mig_enabled
    assert info.compute_mode == "exclusive_process"
    assert info.pci_bus_id == "00000000:18:00.0"
    p0, p1 = info.processes
    assert (p0.pid, p0.name, p0.used_mib) == (8812, "python", 41000)
    # pid 1's name comes from /proc when NVML refuses; its memory is unknown
    assert p1.used_mib is None and p1.name == gpu._proc_comm(1)
    reader.close()
    assert fake.shutdown
