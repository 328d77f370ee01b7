"""``dvc exp run -S key=value`` errors as one line: the one workaround of DVC internals.

DVC composes ``conf/`` with Hydra itself (``hydra.enabled``) and reports every exception
that is not its own ``DvcException`` as a multi-line "unexpected error" with a support
footer, so a typo in ``-S train.epocs=2`` or a wrong type in ``-S train.epochs=abc``
looks like a crash of DVC. The only code of ours DVC runs before composing is the Hydra
plugin package ``hydra_plugins/eagle3_pipeline_schema`` (imported by
``dvc.utils.hydra.load_hydra_plugins``), which calls :func:`one_line_compose_errors`: it
wraps Hydra's ``Hydra.compose_config`` (what ``hydra.compose`` calls) so that a
composition error becomes a ``DvcException`` carrying the same one line that
``eagle3-compose`` prints. DVC then prints ``ERROR: params: <line>`` and exits non-zero.
The wrapper also runs the schema's own checks (ranges, cross-key rules:
``core.config.rules.validate``) on the composed result, so ``-S validate.k=0`` is refused the
same way, before DVC writes params.yaml or runs a stage.

Only when DVC is the running program (``dvc`` imported); ``tests/compat/test_compat.py``
checks the internals this relies on and the line DVC prints.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

MARK = "_eagle3_one_line"


def one_line_compose_errors() -> bool:
    """Install the wrapper (idempotent); False when DVC is not running."""
    if "dvc" not in sys.modules:
        return False
    from dvc.exceptions import DvcException
    from hydra._internal.hydra import Hydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from eagle3_pipeline.core.config import COMPOSING_HERE, check_composed
    from eagle3_pipeline.core.config.wording import compose_error_line
    from eagle3_pipeline.core.errors import ConfigError

    original = Hydra.compose_config
    if getattr(original, MARK, False):
        return True

    @functools.wraps(original)
    def compose_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        if COMPOSING_HERE.get():  # our own compose() in a process that imported DVC
            return original(self, *args, **kwargs)
        try:
            cfg = original(self, *args, **kwargs)
        except (HydraException, OmegaConfBaseException) as exc:
            raise DvcException(f"params: {compose_error_line(exc)}") from None
        try:
            check_composed(cfg)
        except ConfigError as exc:
            raise DvcException(f"params: {exc}") from None
        return cfg

    setattr(compose_config, MARK, True)
    Hydra.compose_config = compose_config  # type: ignore[method-assign]
    return True
