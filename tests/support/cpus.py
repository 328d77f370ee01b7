"""CPUs as the platform reports them (``/proc/cpuinfo``'s text and torch's answers), so
tests state the CPU a branch is for instead of reading the machine they run on."""

from __future__ import annotations

from eagle3_pipeline.runtime.cpu import CpuReading, TorchCpuView, read_cpu


def cpuinfo(model: str, vendor: str, flags: str, processors: int = 2) -> str:
    """``/proc/cpuinfo``'s text for ``processors`` identical cores."""
    block = (
        f"processor\t: {{i}}\nvendor_id\t: {vendor}\nmodel name\t: {model}\n"
        f"flags\t\t: fpu sse sse2 {flags}\nbogomips\t: 5200.00\n\n"
    )
    return "".join(block.format(i=i) for i in range(processors))


# an Intel Xeon with AMX (Sapphire Rapids): tiles, AMX-BF16 and AVX512-BF16
XEON_AMX_INFO = cpuinfo(
    "Intel(R) Xeon(R) Processor", "GenuineIntel", "avx2 avx512f avx512_bf16 amx_bf16 amx_tile"
)
# an AMD EPYC with AVX-512 but no BF16 unit (Zen 3 has AVX2 only; Zen 4 adds both)
EPYC_INFO = cpuinfo("AMD EPYC 7B13 64-Core Processor", "AuthenticAMD", "avx2 fma")
# AMD EPYC Zen 4: AVX512-BF16, no AMX
EPYC_ZEN4_INFO = cpuinfo(
    "AMD EPYC 9B14 96-Core Processor", "AuthenticAMD", "avx2 avx512f avx512_bf16"
)

TORCH_AMX = TorchCpuView("AVX512", amx=True, avx512_bf16=True)
TORCH_AVX512_BF16 = TorchCpuView("AVX512", amx=False, avx512_bf16=True)
TORCH_AVX2 = TorchCpuView("AVX2", amx=False, avx512_bf16=False)

XEON_AMX: CpuReading = read_cpu(XEON_AMX_INFO, TORCH_AMX)
EPYC_ZEN4: CpuReading = read_cpu(EPYC_ZEN4_INFO, TORCH_AVX512_BF16)
EPYC: CpuReading = read_cpu(EPYC_INFO, TORCH_AVX2)
