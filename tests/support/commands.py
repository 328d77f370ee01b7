"""The one way a test runs a command: DVC, git, a stage, a tool, each in a subprocess.

Why one helper: a test's subprocess needs the same environment everywhere (this
interpreter's ``bin`` first on PATH, so ``dvc`` and the ``eagle3-*`` entry points are the
ones under test; DVC's analytics off; a git identity for the commits ``dvc exp`` makes),
and a failure should show the command's own output, not a bare return code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def command_env(**extra: str) -> dict[str, str]:
    """The environment of a test's subprocess, with ``extra`` on top."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["DVC_NO_ANALYTICS"] = "1"
    for who in ("GIT_AUTHOR", "GIT_COMMITTER"):
        env.setdefault(f"{who}_NAME", "test")
        env.setdefault(f"{who}_EMAIL", "test@example.invalid")
    return {**env, **extra}


def run(
    cwd: Path, *cmd: str | Path, timeout: float = 1500, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``cmd`` in ``cwd``, its output captured; whatever its exit code."""
    return subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env or command_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_ok(
    cwd: Path, *cmd: str | Path, timeout: float = 1500, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``cmd`` in ``cwd``; a non-zero exit fails the test with the ends of its output."""
    proc = run(cwd, *cmd, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(str(c) for c in cmd)} failed ({proc.returncode}):\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return proc


def dvc(cwd: Path, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    """``dvc *args`` (this interpreter's DVC) in ``cwd``, which must succeed."""
    return run_ok(cwd, sys.executable, "-m", "dvc", *args, timeout=timeout)


def stage(
    cwd: Path, name: str, *args: str | Path, timeout: float = 1500
) -> subprocess.CompletedProcess[str]:
    """The stage entrypoint ``name`` (``python -m eagle3_pipeline.stages.NAME ARGS``) in
    ``cwd``, whatever its exit code: the bad-input tests read its one-line error."""
    return run(cwd, sys.executable, "-m", f"eagle3_pipeline.stages.{name}", *args, timeout=timeout)
