"""The draft checkpoint validator: will vLLM and speculators load this EAGLE-3 draft
correctly? One module per thing a rule reads (see :mod:`.validator`); the validator runs
them all into one :class:`Report`."""

from eagle3_pipeline.validate.checkpoint.report import Finding, Report
from eagle3_pipeline.validate.checkpoint.validator import validate_checkpoint

__all__ = ["Finding", "Report", "validate_checkpoint"]
