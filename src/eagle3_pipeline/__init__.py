"""eagle3-pipeline: train an EAGLE-3 draft for a large target LLM and prove it works.

The package is split into small library modules (one purpose each) and thin stage
entrypoints under :mod:`eagle3_pipeline.stages` that DVC calls.
"""

__version__ = "0.1.0"
