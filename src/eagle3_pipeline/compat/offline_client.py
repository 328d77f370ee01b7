"""speculators' ``generate-offline-data`` client, made to send the server's API key.

Every server the pipeline starts requires a per-run API key (see
:mod:`eagle3_pipeline.serving.server`), but speculators 0.9's client builds its OpenAI
client with ``api_key="EMPTY"`` and no way to pass another. Run as
``python -m eagle3_pipeline.compat.offline_client generate-offline-data ...``, this module
replaces ``openai.AsyncOpenAI`` (which the client looks up at call time, through the
``openai`` module) with a subclass that substitutes the key from :data:`KEY_ENV` for that
placeholder, then runs speculators' own CLI unchanged. The key travels in the environment,
never on the command line (``ps`` shows command lines to every user of the node).

``tests/compat/test_compat.py`` runs the real client against a localhost server and fails if the
key stops arriving, i.e. when speculators changes how it builds its client.
"""

from __future__ import annotations

import os
import sys
from typing import Any

MODULE = "eagle3_pipeline.compat.offline_client"
KEY_ENV = "EAGLE3_SERVER_API_KEY"
PLACEHOLDER = "EMPTY"  # what speculators passes as api_key


def client_env(api_key: str) -> dict[str, str]:
    """The client's environment: ours plus the key."""
    return {**os.environ, KEY_ENV: api_key}


def send_api_key(api_key: str) -> None:
    """From now on, ``openai.AsyncOpenAI(api_key="EMPTY")`` authenticates with ``api_key``."""
    import openai

    base = openai.AsyncOpenAI
    if getattr(base, "_eagle3_keyed", False):
        return

    class KeyedAsyncOpenAI(base):  # type: ignore[misc,valid-type]
        _eagle3_keyed = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if kwargs.get("api_key") in (None, PLACEHOLDER):
                kwargs["api_key"] = api_key
            super().__init__(*args, **kwargs)

    openai.AsyncOpenAI = KeyedAsyncOpenAI  # type: ignore[misc]


def main() -> None:
    key = os.environ.get(KEY_ENV)
    if key:
        send_api_key(key)
    from speculators.cli import app

    sys.argv[0] = "speculators"
    app()


if __name__ == "__main__":
    main()
