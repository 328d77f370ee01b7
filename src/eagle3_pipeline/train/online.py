"""Online hidden states: the train stage's own vLLM extraction server.

With ``extract.mode=online`` the extract stage writes only a manifest naming the engine
(the same ``extract_hidden_states`` engine and connector as the offline ``vllm`` backend).
The train stage starts that server before training and stops it after, whatever happens
(:class:`~eagle3_pipeline.serving.server.VllmServer`: on errors, Ctrl-C, SIGTERM, and
through its guard even when the stage is killed with SIGKILL). The workers reach it through
three environment variables, so the in-process run and torchrun's workers see it alike;
the API key never appears on a command line or in a log.

Each request's connector file lands in a staging directory private to this run, is read,
checked against its row, converted to the manifest's dtype (exactly what offline
extraction stores) and deleted: at any moment the disk holds only the batches in flight
(``train.prefetch_batches`` ahead of the step).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from eagle3_pipeline.core.errors import StageError
from eagle3_pipeline.extract.record import ExtractManifest
from eagle3_pipeline.serving.engine import Engine
from eagle3_pipeline.train.errors import TrainingError

log = logging.getLogger(__name__)

ENV_URL = "EAGLE3_ONLINE_URL"
ENV_KEY = "EAGLE3_ONLINE_API_KEY"
ENV_MODEL = "EAGLE3_ONLINE_MODEL"


@dataclass(frozen=True)
class OnlineSource:
    """The manifest's ``online`` section: the engine to start and how to reach it."""

    engine: Engine  # with the staging placeholder (see :func:`_engine`)
    python: str | None
    port: int
    concurrency: int
    staging_dir: str | None
    startup_timeout_s: float
    shutdown_timeout_s: float
    log_file: str
    dtype: str  # what offline extraction would have stored

    @classmethod
    def from_manifest(cls, path: Path, manifest: ExtractManifest) -> OnlineSource:
        sec = manifest.online  # typed: the record's reader checked every field
        if sec is None:
            raise TrainingError(
                f"{path}: an online manifest without its online section: rerun the extract stage"
            )
        return cls(
            engine=sec.engine,
            python=sec.python,
            port=sec.port,
            concurrency=max(1, sec.concurrency),
            staging_dir=sec.staging_dir,
            startup_timeout_s=sec.startup_timeout_s,
            shutdown_timeout_s=sec.shutdown_timeout_s,
            log_file=sec.log_file,
            dtype=str(manifest.dtype),
        )


@dataclass(frozen=True)
class Endpoint:
    """Where the workers send requests (read from the environment the stage set)."""

    url: str
    api_key: str
    model: str

    @classmethod
    def from_env(cls) -> Endpoint:
        url, key, model = (os.environ.get(k) for k in (ENV_URL, ENV_KEY, ENV_MODEL))
        if not (url and key and model):
            raise TrainingError(
                "extract.mode=online: no extraction server (the train stage starts it; "
                f"{ENV_URL}, {ENV_KEY} and {ENV_MODEL} are unset)"
            )
        return cls(url, key, model)


def _engine(source: OnlineSource, staging: Path) -> Engine:
    """The recorded engine with train's staging directory in place of the placeholder (a
    copy: the source stays as recorded)."""
    from eagle3_pipeline.serving.engine import STAGING_PLACEHOLDER

    kv = source.engine.kv_transfer_config
    if kv is None or kv.kv_connector_extra_config.get("shared_storage_path") != (
        STAGING_PLACEHOLDER
    ):
        raise TrainingError(
            "online manifest: the engine has no staging placeholder: rerun the extract stage"
        )
    extra = {**kv.kv_connector_extra_config, "shared_storage_path": str(staging.absolute())}
    return dataclasses.replace(
        source.engine,
        kv_transfer_config=dataclasses.replace(kv, kv_connector_extra_config=extra),
    )


@contextlib.contextmanager
def online_server(source: OnlineSource) -> Iterator[Endpoint]:
    """Serve the manifest's engine for the duration of the block, with the endpoint in
    this process's environment (inherited by torchrun's workers)."""
    from eagle3_pipeline.serving.env import find_python
    from eagle3_pipeline.serving.server import engine_server

    parent = Path(source.staging_dir) if source.staging_dir else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="eagle3-online-", dir=parent))
    saved = {k: os.environ.get(k) for k in (ENV_URL, ENV_KEY, ENV_MODEL)}
    try:
        engine = _engine(source, staging)
        server = engine_server(
            engine,
            find_python(source.python),
            source.port,
            source.log_file,
            source.startup_timeout_s,
            source.shutdown_timeout_s,
            port_key="extract.server.port",
            error=StageError,
            remove=[staging],
        )
        with server:
            os.environ[ENV_URL] = f"{server.url}/v1"
            os.environ[ENV_KEY] = server.api_key
            os.environ[ENV_MODEL] = engine.served_model_name
            log.info("online hidden states from %s (staging %s)", server.url, staging)
            try:
                yield Endpoint(os.environ[ENV_URL], server.api_key, os.environ[ENV_MODEL])
            except StageError:
                died = server.death()
                if died:  # the workers' errors were its symptoms
                    raise StageError(f"{died}; rerun (`dvc repro`) to resume") from None
                raise
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(staging, ignore_errors=True)
