"""A ``vllm serve`` process that never outlives the stage that started it.

Three stages start one: prepare (on-policy regeneration, ``regenerate.py``), extract
(hidden states, ``extract/vllm_backend.py``) and validate (vLLM's acceptance counters,
``validate/vllm.py``). A server left behind keeps its GPU memory, and the next run then
fails on the same GPUs far from the cause, so the lifecycle lives here once:

- The server runs in its own session, so in its own process group: vLLM's engine core and
  TP/PP workers are children of the API process and only a signal to the group reaches
  them all. (A Ctrl-C at the terminal therefore reaches only the stage, which then stops
  the server itself, in order.)
- Shutdown is SIGTERM to the group, a bounded wait, SIGKILL; then SIGKILL to the group
  once more even when the leader has exited, for workers that outlived it
  (:mod:`eagle3_pipeline.runtime.processes`, shared with the train stage's torchrun).
- It is private to the run: the process gets a random API key (``VLLM_API_KEY`` in its
  environment, which other users cannot read, unlike its command line in ``ps``), which
  every request of ours sends and which is never logged. On a shared node no other user
  can query the target or feed an extraction server while it runs.
- It is the server we started, serving our target: the port must be free before the
  start, the process alive once healthy, and ``/v1/models`` + a token probe must match
  (:mod:`eagle3_pipeline.serving.identity`), so a server someone else runs on the same
  port is never mistaken for ours.
- It happens on normal exit, on an error, on Ctrl-C and on SIGTERM (DVC or a scheduler
  stopping the stage): while a server runs, both signals raise
  :class:`~eagle3_pipeline.runtime.signals.Interrupted` in the main thread, so the ``with``
  block unwinds instead of the process dying with the group still running.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.errors import StageError
from eagle3_pipeline.runtime.processes import process_group, start_group, stop_group
from eagle3_pipeline.runtime.signals import interrupts_raise
from eagle3_pipeline.serving.identity import (
    ExpectedModel,
    ServerIdentityError,
    expected_model,
    verify_server,
)

log = logging.getLogger(__name__)

POLL_S = 1.0  # between health checks
TAIL_BYTES = 64 * 1024  # of the log read for the tail in an error message


class VllmServer:
    """A ``vllm serve`` process that is always shut down: on normal exit, on an error, on
    Ctrl-C and on SIGTERM, so GPU memory is freed (see the module docstring).

    Entering starts ``cmd`` with stdout and stderr appended to ``log_file`` and returns
    once ``http://127.0.0.1:{port}{health_path}`` answers 200. If the process exits first,
    or ``startup_timeout_s`` passes, it raises ``error`` (``StageError`` unless the calling
    module has its own contract) with the tail of the log; the timeout message names
    ``timeout_key``, the config key to raise."""

    def __init__(
        self,
        cmd: Sequence[str],
        port: int,
        log_file: str | Path,
        startup_timeout_s: float,
        shutdown_timeout_s: float,
        *,
        timeout_key: str,
        health_path: str = "/health",
        error: type[Exception] = StageError,
        env: dict[str, str] | None = None,
        expected: ExpectedModel | None = None,
        port_key: str | None = None,
        remove: Sequence[str | Path] = (),
    ) -> None:
        self.cmd = list(cmd)
        self.remove = list(remove)  # deleted by the group's guard once vLLM has exited
        self.api_key = secrets.token_urlsafe(32)
        self.env = {**(env if env is not None else os.environ), "VLLM_API_KEY": self.api_key}
        self.port = port
        self.port_key = port_key
        self.expected = expected
        self.served_model: str | None = None
        self.url = f"http://127.0.0.1:{port}"
        self.health_url = self.url + health_path
        self.log_file = Path(log_file)
        self.startup_timeout_s = startup_timeout_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.timeout_key = timeout_key
        self.error = error
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0  # the log is appended to across runs: the tail is this run's
        self._signals: contextlib.ExitStack | None = None

    def __enter__(self) -> VllmServer:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._signals = contextlib.ExitStack()
        self._signals.enter_context(interrupts_raise())
        try:
            check_port_free(self.port, self.port_key, self.error)
            with open(self.log_file, "ab") as logfh:
                self._log_start = os.fstat(logfh.fileno()).st_size
                self.proc = start_group(
                    self.cmd, self.remove, stdout=logfh, stderr=subprocess.STDOUT, env=self.env
                )
            self.wait_healthy()
            self.verify()
        except BaseException:
            self.shutdown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def log_tail(self, n: int = 20) -> str:
        """The last ``n`` lines this run wrote to the log."""
        with contextlib.suppress(OSError):
            with open(self.log_file, "rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                start = self._log_start if self._log_start <= size else 0  # truncated
                fh.seek(max(start, size - TAIL_BYTES))
                text = fh.read().decode("utf-8", errors="replace")
            return "\n".join(text.splitlines()[-n:])
        return ""

    def wait_healthy(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                tail = self.log_tail(200)
                raise self.error(
                    f"vllm serve exited with {rc} before becoming healthy: {cause(tail)} "
                    f"(log {self.log_file})"
                )
            # URLError, refused or reset connections and timeouts are all OSErrors
            with contextlib.suppress(OSError):
                req = urllib.request.Request(  # noqa: S310 -- our localhost URL
                    self.health_url, headers={"Authorization": f"Bearer {self.api_key}"}
                )
                with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310
                    if resp.status == 200:
                        return
            time.sleep(POLL_S)
        raise self.error(
            f"vllm serve not healthy at {self.health_url} after {self.startup_timeout_s:.0f}s "
            f"(raise {self.timeout_key}; log {self.log_file}); last: {cause(self.log_tail(200))}"
        )

    def verify(self) -> None:
        """Once healthy: still our process, and serving the expected model."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise self.error(
                f"vllm serve exited with {self.proc.returncode} while another "
                f"process answered on {self.url}: {cause(self.log_tail(200))}"
            )
        if self.expected is not None:
            try:
                self.served_model = verify_server(
                    self.url, self.api_key, self.expected, where=self.port_key or ""
                )
            except ServerIdentityError as exc:
                raise self.error(str(exc)) from None

    def death(self) -> str | None:
        """None while the server runs; once its process has ended, how (exit status or
        signal) and where its log is: a client's failure is then the server's death."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return (
            f"the vLLM server (pid {self.proc.pid}) died: {exit_description(self.proc.returncode)}"
            f"; its log: {self.log_file}"
        )

    def shutdown(self) -> None:
        proc, self.proc = self.proc, None
        try:
            if proc is not None:
                stop_group(proc, self.shutdown_timeout_s, "vllm serve")
        finally:
            signals, self._signals = self._signals, None
            if signals is not None:
                signals.close()


# The most telling line first: pydantic's message (vLLM's config validation), an
# exception with its text, a CLI or socket error; generic wrappers are skipped.
_CAUSES = (
    re.compile(r"Value error, (.*)"),
    re.compile(r"\b(\w+(?:Error|Exception|Exit)): (?!\d+ validation error)(.+)"),
    re.compile(r"(?i).*\b(address already in use|unrecognized arguments.*|error: .*)"),
)
_NOISE = ("See root cause above", "Traceback", 'File "', "raise ", "^")
# vLLM's wrappers that point elsewhere for the reason: never the cause themselves
_WRAPPERS = (
    "See root cause above",
    "See stack trace",
    "EngineDeadError",
    "EngineGenerateError",
    "Engine core initialization failed",
    "please check the stack trace above",
)


def exit_description(rc: int) -> str:
    """``killed by SIGKILL`` for -9, ``exit status 1`` for 1."""
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


def cause(log_text: str) -> str:
    """The one line of a vLLM log that says why it stopped: the most telling line that is
    not one of vLLM's wrappers ("EngineDeadError: EngineCore encountered an issue. See
    stack trace (above)", "Engine core initialization failed. See root cause above")."""
    lines = [ln.strip() for ln in log_text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not any(n in ln[:40] for n in _NOISE)]
    for pattern in _CAUSES:
        for line in reversed(lines):
            m = pattern.search(line)
            if m and not any(w in line for w in _WRAPPERS):
                return m.group(0).strip()[:400]
    return lines[-1][:400] if lines else "no output"


def check_port_free(
    port: int, port_key: str | None = None, error: type[Exception] = StageError
) -> None:
    """Refuse a port something already listens on: a health check would otherwise reach
    that process while our server fails to bind."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is fine
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            where = f"{port_key}={port}: " if port_key else ""
            raise error(
                f"{where}port {port} on 127.0.0.1 is in use ({exc.strerror}); stop "
                "what listens there or choose a free port"
            ) from None


def engine_expected(engine: Any) -> ExpectedModel:
    """What a server for ``engine`` must report: its served name, its model path, and the
    token ids of the probe under the model's own tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        str(engine.model), trust_remote_code=engine.trust_remote_code
    )
    return expected_model(
        f"{engine.served_model_name} ({engine.model})",
        (engine.served_model_name, engine.model),
        tokenizer,
    )


def engine_server(
    engine: Any,
    python: str | Path,
    port: int,
    log_file: str | Path,
    startup_timeout_s: float,
    shutdown_timeout_s: float,
    *,
    port_key: str | None = None,
    health_path: str = "/health",
    error: type[Exception] = StageError,
    remove: Sequence[str | Path] = (),
) -> VllmServer:
    """``vllm serve`` for an :class:`~eagle3_pipeline.serving.engine.Engine`, run by the vLLM
    environment's ``python`` with the engine's environment variables; ``port_key`` is the
    config key that sets ``port``."""
    from eagle3_pipeline.serving.env import worker_env

    log.info("starting (log %s): %s", log_file, engine.shell(port))
    return VllmServer(
        engine.serve_argv(port, (str(python), "-m", "vllm.entrypoints.cli.main")),
        port,
        log_file,
        startup_timeout_s,
        shutdown_timeout_s,
        timeout_key="vllm.startup_timeout_s",
        health_path=health_path,
        error=error,
        env=worker_env(engine.env),
        expected=engine_expected(engine),
        port_key=port_key,
        remove=remove,
    )


@contextlib.contextmanager
def child_process(
    cmd: Sequence[str], stop_timeout_s: float = 30.0, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A child process (in its own process group) that is terminated if we leave early
    (error or Ctrl-C), e.g. a client that would keep sending requests to a server being
    shut down."""
    with process_group(cmd, stop_timeout_s, " ".join(map(str, cmd[:4])), env=env) as proc:
        yield proc
