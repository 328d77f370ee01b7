"""``torch.optim.Muon`` on a CPU: the Newton-Schulz iteration in float32, not bfloat16.

Why: torch's Muon (checked on 2.14) orthogonalises each update in bfloat16
(``torch/optim/_muon.py`` ``_zeropower_via_newtonschulz``: ``grad.bfloat16()``), a choice
made for GPUs, whose tensor cores multiply bfloat16 natively. A CPU without AVX512-BF16 or
AMX (the 2-core AMD EPYC machines this project runs on) multiplies bfloat16 matrices
through a slow path: 5.6x slower than float32 for one 576 x 1728 gram matrix here, and a
SmolLM2-135M draft (Muon over fc, the decoder layer and the 4,096 x 576 lm_head) trained
at 24 s a step instead of about 1 s. The same iteration in float32 is the same algorithm
at a higher precision (its result differs from the bfloat16 one by bfloat16's rounding),
so on a CPU it is used instead; on CUDA nothing changes.

:func:`float32_newton_schulz_on_cpu` patches the module attribute that torch's
``_single_tensor_muon`` calls; ``tests/compat/test_compat.py`` fails once torch stops computing
in bfloat16 on a CPU (then this module can go) or renames the function.
"""

from __future__ import annotations

from typing import Any

_PATCHED = "_eagle3_float32_on_cpu"


def newton_schulz_float32(
    grad: Any, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float
) -> Any:
    """torch's quintic Newton-Schulz iteration (``_zeropower_via_newtonschulz``), in
    float32: the same coefficients, steps, normalisation and transposition."""
    if ns_steps >= 100:
        raise ValueError("Number of steps must be less than 100 for computational efficiency")
    if len(grad.shape) != 2:
        raise ValueError("Input tensor gradient must be a 2D matrix")
    if len(ns_coefficients) != 3:
        raise ValueError("Coefficients must be a tuple of exactly 3 values")
    a, b, c = ns_coefficients
    x = grad.float()
    tall = grad.size(0) > grad.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        update = b * gram + c * (gram @ gram)
        x = a * x + update @ x
    return x.T if tall else x


def float32_newton_schulz_on_cpu() -> bool:
    """Make torch's Muon orthogonalise CPU tensors in float32 (CUDA tensors as before).
    Idempotent; returns whether torch's function is (now) the patched one."""
    import torch.optim._muon as muon

    original = getattr(muon, "_zeropower_via_newtonschulz", None)
    if original is None:
        return False
    if getattr(original, _PATCHED, False):
        return True

    def zeropower(
        grad: Any, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float
    ) -> Any:
        if grad.device.type == "cpu":
            return newton_schulz_float32(grad, ns_coefficients, ns_steps, eps)
        return original(grad, ns_coefficients, ns_steps, eps)

    setattr(zeropower, _PATCHED, True)
    zeropower.__wrapped__ = original  # type: ignore[attr-defined]
    muon._zeropower_via_newtonschulz = zeropower
    return True
