"""The CPU's bf16 capability: each branch stated by what the platform reports (the CPU
flags and torch's answers), never read from the machine running the test."""

from __future__ import annotations

import pytest
from cpus import (
    EPYC,
    EPYC_INFO,
    EPYC_ZEN4,
    EPYC_ZEN4_INFO,
    TORCH_AMX,
    TORCH_AVX2,
    TORCH_AVX512_BF16,
    XEON_AMX,
    XEON_AMX_INFO,
)

from eagle3_pipeline.runtime.cpu import (
    TorchCpuView,
    bf16_from_flags,
    parse_cpuinfo,
    read_cpu,
    torch_cpu_view,
)


def test_parse_reads_the_first_processor() -> None:
    model, vendor, flags = parse_cpuinfo(XEON_AMX_INFO)
    assert model == "Intel(R) Xeon(R) Processor" and vendor == "GenuineIntel"
    assert {"amx_tile", "amx_bf16", "avx512_bf16"} <= flags


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}, "amx"),
        ({"avx2", "avx512f", "avx512_bf16", "amx_tile"}, "avx512_bf16"),  # tiles, no bf16 unit
        ({"avx2", "avx512f", "avx512_bf16"}, "avx512_bf16"),
        ({"avx2", "avx512f"}, "none"),  # AVX-512 without BF16: emulated
        ({"avx2"}, "none"),
        (set(), "none"),
    ],
)
def test_flags_decide_the_capability(flags: set[str], expected: str) -> None:
    assert bf16_from_flags(flags) == expected


def test_the_three_kinds_of_cpu() -> None:
    assert (XEON_AMX.bf16, XEON_AMX.native_bf16, XEON_AMX.note) == ("amx", True, None)
    assert XEON_AMX.flags == ["amx_bf16", "amx_tile", "avx2", "avx512_bf16", "avx512f"]
    assert (EPYC_ZEN4.bf16, EPYC_ZEN4.native_bf16) == ("avx512_bf16", True)
    assert (EPYC.bf16, EPYC.native_bf16, EPYC.vendor) == ("none", False, "AuthenticAMD")
    assert XEON_AMX.describe() == "Intel(R) Xeon(R) Processor; native bf16: AMX + AVX512-BF16"
    assert EPYC.describe().endswith("; native bf16: none")


def test_the_lower_of_flags_and_torch_is_kept_and_the_disagreement_said() -> None:
    # the kernel lists AMX, but torch could not get the tile state (a container refusing it)
    refused = read_cpu(XEON_AMX_INFO, TORCH_AVX512_BF16)
    assert refused.bf16 == "avx512_bf16"
    assert refused.note == "the CPU flags say amx, torch says avx512_bf16: avx512_bf16 kept"
    # torch claims more than the flags list: the flags win
    claims = read_cpu(EPYC_INFO, TORCH_AMX)
    assert claims.bf16 == "none" and claims.note is not None and "torch says amx" in claims.note


def test_one_source_missing_lets_the_other_decide() -> None:
    no_proc = read_cpu(None, TORCH_AMX)
    assert no_proc.bf16 == "amx" and no_proc.flags is None and no_proc.model is None
    assert no_proc.note is not None and "torch's report decides" in no_proc.note
    no_torch = read_cpu(XEON_AMX_INFO, TorchCpuView(None, None, None, "torch is not importable"))
    assert no_torch.bf16 == "amx"
    assert no_torch.note is not None and "the CPU flags decide" in no_torch.note
    neither = read_cpu(None, TorchCpuView(None, None, None, "x"))
    assert neither.bf16 == "none" and neither.note is not None
    assert read_cpu(EPYC_INFO, TORCH_AVX2).note is None


def test_torch_still_answers_the_probes_preflight_asks() -> None:
    """The probes are torch's private CPU helpers: this fails when torch drops them
    (the reading would then fall back to the CPU flags, with a note)."""
    view = torch_cpu_view()
    assert view.error is None, view.error
    assert view.capability and isinstance(view.amx, bool) and isinstance(view.avx512_bf16, bool)


def test_the_cores_are_the_process_affinity_not_the_machine_count() -> None:
    """A run's CPU-hours multiply its wall time by these (eagle3-compare --x)."""
    from eagle3_pipeline.runtime.cpu import read_this_cpu, usable_cores

    assert read_cpu(EPYC_ZEN4_INFO, TORCH_AVX512_BF16, cores=2).cores == 2
    assert read_cpu(EPYC_ZEN4_INFO, TORCH_AVX512_BF16).cores is None  # not read: not guessed
    assert usable_cores() == read_this_cpu().cores
    cores = usable_cores()
    assert cores is not None and cores >= 1
