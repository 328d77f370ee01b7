"""Running code in the separate vLLM environment from tests (real vLLM, CPU build).

A missing environment is a failure, not a skip: CI installs it (README's test command)."""

from __future__ import annotations

import subprocess
import textwrap

from eagle3_pipeline.serving.env import find_python, worker_env


def run_in_vllm(
    code: str, timeout: float = 600.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with the vLLM environment's interpreter; stdout/stderr captured."""
    return subprocess.run(
        [str(find_python()), "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=worker_env(env),
    )
