"""speculators' EAGLE-3 forward with its vocabulary argmaxes computed by ``max``.

Why: every TTT step of speculators' forward (0.9: ``models/eagle3/core.py`` and
``models/eagle3/metrics.py`` ``compute_metrics``) takes three ``torch.argmax`` over the
draft vocabulary: the draft's next token (discarded by teacher forcing, but computed) and
the draft's and the target's token for the accuracies. On a CPU, torch's ``argmax`` over
the last dimension is several times slower than ``max(dim).indices``, which returns the
same index (the first maximal one: both are documented so); on SmolLM2-135M's rows (1024
tokens, 4096 draft tokens) one bf16 argmax took 8 ms against 1.9 for ``max``, 9 a step:
about a tenth of a bf16 train step (an Intel Xeon with AMX, 2 cores).

:func:`argmax_by_max` is a context manager: while it is open the two modules see a
``torch`` whose ``argmax(x, dim)`` is ``x.max(dim).indices`` (everything else is torch
itself); on exit they see torch again. Scoped, so that speculators' own ``Trainer``
(``bench/train.py`` runs it in the same process) computes as it always has.
``tests/compat/test_compat.py`` fails when the modules stop calling ``torch.argmax`` or
renames them; the results with and without the context are equal.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

MODULES = ("speculators.models.eagle3.core", "speculators.models.eagle3.metrics")


def _argmax(x: Any, dim: int | None = None, keepdim: bool = False) -> Any:
    import torch

    if dim is None:
        return torch.argmax(x)
    return x.max(dim, keepdim).indices


class _Torch(types.ModuleType):
    """torch, with :func:`_argmax` for ``argmax``."""

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch, name)

    argmax = staticmethod(_argmax)


@contextlib.contextmanager
def argmax_by_max() -> Iterator[None]:
    """speculators' EAGLE-3 forward, inside, takes its argmaxes by ``max``."""
    import importlib

    import torch

    modules = [importlib.import_module(m) for m in MODULES]
    proxy = _Torch()
    for m in modules:
        m.torch = proxy  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for m in modules:
            m.torch = torch  # type: ignore[attr-defined]
