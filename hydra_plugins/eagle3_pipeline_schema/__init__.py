"""Registers eagle3_pipeline's config schema when Hydra scans its plugins.

DVC (``hydra.enabled``) imports every module under ``hydra_plugins/`` in the repository
root before it composes ``conf/`` for ``dvc exp run``; the schema then validates ``-S``
overrides (an unknown key or a wrong type fails before any stage runs), and the error is
one line naming the key (``compat.dvc``) instead of DVC's multi-line "unexpected error".
"""

from eagle3_pipeline.compat.dvc import one_line_compose_errors
from eagle3_pipeline.core.config import register_schema

register_schema()
one_line_compose_errors()
