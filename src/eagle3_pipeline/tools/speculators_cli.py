"""``python -m eagle3_pipeline.tools.speculators_cli ARGS``: speculators' own training CLI
with only the patches a CPU-only host needs (see ``stock_cli_main``)."""

from __future__ import annotations

import sys

from eagle3_pipeline.compat.speculators import stock_cli_main

if __name__ == "__main__":
    stock_cli_main(sys.argv[1:])
