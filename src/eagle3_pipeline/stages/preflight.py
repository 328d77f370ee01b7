"""Stage `preflight`: check the machine against the hardware profile (NVML GPUs, torch's
view of them, package versions, free disk for the hidden states) before any work starts.

Writes data/preflight/inventory.json (stable, profile-level facts: downstream stages depend
on it), data/preflight/target_fingerprint.json (a local target's files, cheaply: the target
stage depends on it, so a checkpoint changed in place reruns the graph) and
metrics/preflight.json (volatile readings and the verdict of each check).
Exits 1 when a check fails, unless preflight.strict=false (failures become warnings).
"""

from __future__ import annotations

import logging

from eagle3_pipeline.core.errors import ConfigError, StageError
from eagle3_pipeline.preflight.result import render_preflight
from eagle3_pipeline.preflight.run import check_machine
from eagle3_pipeline.preflight.view import PreflightInputs
from eagle3_pipeline.stages.runner import run_stage

log = logging.getLogger(__name__)

INPUTS = PreflightInputs


def run(cfg: PreflightInputs) -> None:
    result = check_machine(cfg)
    print(render_preflight(result), flush=True)
    if result.passed:
        return
    for check in result.checks:  # a config error: no strictness setting makes the graph run
        if check.name in ("target", "data") and not check.passed:
            raise ConfigError(check.problems[0])
    n = len(result.problems)
    if cfg.preflight.strict:
        more = f" (and {n - 1} more, listed above)" if n > 1 else ""
        raise StageError(
            f"{result.problems[0]}{more}; preflight.strict=false turns problems into warnings"
        )
    log.warning("preflight: %d problem(s) ignored because preflight.strict=false", n)


def main(argv: list[str] | None = None) -> None:
    # a failed preflight's report is what the user reads: it is not replaced by the last pass's
    run_stage("preflight", __doc__ or "", INPUTS.from_config, run, argv, restore_on_failure=False)


if __name__ == "__main__":
    main()
