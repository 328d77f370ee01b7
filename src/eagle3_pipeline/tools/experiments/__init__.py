"""Across experiments: which setting gave the best draft (``eagle3-compare``)."""
