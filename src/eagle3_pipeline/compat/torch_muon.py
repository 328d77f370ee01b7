"""``torch.optim.Muon`` on a CPU: the Newton-Schulz iteration in the training's precision.

Why: torch's Muon (checked on 2.14) orthogonalises each update in bfloat16
(``torch/optim/_muon.py`` ``_zeropower_via_newtonschulz``: ``grad.bfloat16()``), a choice
made for GPUs, whose tensor cores multiply bfloat16 natively. A CPU without AVX512-BF16 or
AMX (the 2-core AMD EPYC machines this project runs on) multiplies bfloat16 matrices
through a slow path: 5.6x slower than float32 for one 576 x 1728 gram matrix there, and a
SmolLM2-135M draft (Muon over fc and the decoder layer) trained at 24 s a step instead of
about 1 s. The same iteration in float32 is the same algorithm at a higher precision (its
result differs from the bfloat16 one by bfloat16's rounding). A CPU with native bf16 (AMX)
is the other way round: there the float32 iteration was a third of a bf16 train step (the
Muon step 1.7 s of 4 on SmolLM2's rows, an Intel Xeon with AMX, 2 cores), and torch's own
bfloat16 iteration is the fast one.

So the iteration on CPU tensors follows the precision the draft trains in:
:func:`newton_schulz_on_cpu` (``float32``: this module's float32 iteration; ``bfloat16``:
torch's own). A float32 run computes the same figures on every CPU (the tiny default's
reproducibility), a bf16 run (chosen only where the CPU computes bf16 natively, or asked
for) uses torch's iteration as on a GPU; CUDA tensors always take torch's. It patches the
module attribute that torch's ``_single_tensor_muon`` calls; ``tests/compat/test_compat.py``
fails once torch stops computing in bfloat16 on a CPU or renames the function.
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


_CPU_FLOAT32 = {"on": True}  # the iteration on CPU tensors: float32 (else torch's bf16)


def newton_schulz_on_cpu(dtype: str = "float32") -> bool:
    """Make torch's Muon orthogonalise CPU tensors in ``dtype`` (``float32``: the
    float32 iteration; ``bfloat16``: torch's own), CUDA tensors as before. Idempotent, and
    a later call with another dtype switches it; returns whether torch's function is (now)
    the patched one."""
    import torch.optim._muon as muon

    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"Newton-Schulz precision {dtype!r}: float32 or bfloat16")
    original = getattr(muon, "_zeropower_via_newtonschulz", None)
    if original is None:
        return False
    _CPU_FLOAT32["on"] = dtype == "float32"
    if getattr(original, _PATCHED, False):
        return True

    def zeropower(
        grad: Any, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float
    ) -> Any:
        if grad.device.type == "cpu" and _CPU_FLOAT32["on"]:
            return newton_schulz_float32(grad, ns_coefficients, ns_steps, eps)
        return original(grad, ns_coefficients, ns_steps, eps)

    setattr(zeropower, _PATCHED, True)
    zeropower.__wrapped__ = original  # type: ignore[attr-defined]
    muon._zeropower_via_newtonschulz = zeropower
    return True
