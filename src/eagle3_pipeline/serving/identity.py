"""Is the server at this address serving our target? Checked before any request counts.

Regeneration writes the training data and extraction the hidden states from whatever
answers at a URL. Another vLLM server on the same port (a colleague's, or one left over
from an earlier run) would answer just as well, and the draft would then be trained for a
model that is not the target, silently. So every stage that uses a server checks two
things first and refuses, naming both models, when either fails:

1. **Names.** ``/v1/models`` must list the model under the target's name or path (vLLM
   reports the ``--served-model-name`` as ``id`` and the path it loaded as ``root``).
   Paths are compared resolved; a hub id also matches a local directory ending in the
   same ``org/name``.
2. **Tokens.** ``/tokenize`` (vLLM's; outside ``/v1``) must turn a fixed probe text into
   exactly the ids our tokenizer gives. Two models that share a name but not a tokenizer
   produce token ids that mean different things in our rows.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.errors import StageError

# Mixed scripts, digits, punctuation and spacing: tokenizers that differ anywhere in their
# vocabulary or normalisation rarely agree on all of it.
PROBE_TEXT = (
    "Speculative decoding checks 3 draft tokens per pass: naïve café, Tōkyō 東京, "
    "Δx≈0.5 — `print(x)`\n\ttabs and  spaces."
)
TIMEOUT_S = 30.0


class ServerIdentityError(StageError):
    """The server does not serve the target (or cannot say which model it serves)."""


class ServerUnreachable(ServerIdentityError):
    """Nothing usable answers at the address: no server, or not an OpenAI-compatible one."""


@dataclass(frozen=True)
class ExpectedModel:
    """What a server serving our target reports: any of ``names`` (names or paths) and,
    when known, ``probe_ids`` for :data:`PROBE_TEXT`."""

    label: str  # how messages name the target
    names: tuple[str, ...]
    probe_ids: tuple[int, ...] | None = None


def probe_ids(tokenizer: Any) -> tuple[int, ...]:
    """Our tokenizer's ids for the probe, with special tokens as vLLM adds them by default."""
    return tuple(int(t) for t in tokenizer(PROBE_TEXT, add_special_tokens=True)["input_ids"])


def expected_model(
    label: str, names: Iterable[str | Path | None], tokenizer: Any | None = None
) -> ExpectedModel:
    kept = tuple(dict.fromkeys(str(n) for n in names if n))
    return ExpectedModel(label, kept, probe_ids(tokenizer) if tokenizer is not None else None)


def _as_path(name: str) -> str | None:
    if name.startswith(("/", "./", "../", "~")):
        return str(Path(name).expanduser().resolve())
    return None


def _tail(name: str) -> str:
    """The last two path components, lowercased: ``org/name`` for hub ids and the
    directories they are downloaded to."""
    parts = [p for p in name.replace("\\", "/").rstrip("/").split("/") if p]
    return "/".join(parts[-2:]).lower() if len(parts) >= 2 else ""


def same_model(reported: str, names: Sequence[str]) -> bool:
    """Does a name or path a server reports denote one of ``names``?"""
    for name in names:
        if reported == name:
            return True
        a, b = _as_path(reported), _as_path(name)
        if a is not None and b is not None and a == b:
            return True
        # a hub id against a local copy (or the reverse): compare org/name
        if (a is None) != (b is None) and _tail(reported) and _tail(reported) == _tail(name):
            return True
    return False


def _request(url: str, api_key: str | None, body: dict[str, Any] | None = None) -> Any:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers)  # noqa: S310 -- http(s) only
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:  # noqa: S310
        return json.loads(resp.read().decode("utf-8"))


def server_root(base_url: str) -> str:
    """``http://host:port`` of an OpenAI base URL (``.../v1``): ``/tokenize`` is outside it."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def verify_server(
    base_url: str,
    api_key: str | None,
    expected: ExpectedModel,
    model: str | None = None,
    where: str = "",
) -> str:
    """Check that the server at ``base_url`` serves ``expected``; return the served model
    id to send requests to. ``model`` picks one of several served models by id; ``where``
    (a config key) is named in errors so the user knows what to change."""
    root = server_root(base_url)
    at = f"{where}={base_url}" if where else base_url
    try:
        listed = _request(f"{root}/v1/models", api_key)["data"]
    except urllib.error.HTTPError as exc:
        hint = (
            " (it rejects this run's API key: another server answers on this port)"
            if exc.code in (401, 403)
            else ""
        )
        raise ServerIdentityError(
            f"{at}: /v1/models answered HTTP {exc.code}{hint}; "
            f"cannot tell whether it serves {expected.label}"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ServerUnreachable(
            f"{at}: cannot list its models ({type(exc).__name__}: "
            f"{exc}); is it an OpenAI-compatible vLLM server?"
        ) from None
    served = [
        (str(m.get("id", "")), str(m.get("root") or "")) for m in listed if isinstance(m, dict)
    ]
    shown = ", ".join(f"{i} ({r})" if r and r != i else i for i, r in served) or "none"
    candidates = [(i, r) for i, r in served if model is None or i == model]
    if model is not None and not candidates:
        raise ServerIdentityError(
            f"{at} does not serve a model named {model!r} (it serves {shown})"
        )
    match = next(
        (
            i
            for i, r in candidates
            if same_model(i, expected.names) or (r and same_model(r, expected.names))
        ),
        None,
    )
    if match is None:
        raise ServerIdentityError(
            f"{at} serves {shown}, not the target {expected.label}: stop that server or point "
            f"{where or 'the stage'} at one serving the target (vllm serve <target> "
            f"--served-model-name {expected.names[0]})"
        )
    if expected.probe_ids is not None:
        check_tokens(root, api_key, match, expected, at)
    return match


def check_tokens(
    root: str, api_key: str | None, model: str, expected: ExpectedModel, at: str
) -> None:
    """The served tokenizer gives our ids for :data:`PROBE_TEXT` (nothing to check when
    ``expected`` has none)."""
    want = expected.probe_ids
    if want is None:
        return
    try:
        got = _request(
            f"{root}/tokenize",
            api_key,
            {"model": model, "prompt": PROBE_TEXT, "add_special_tokens": True},
        )
        ids = tuple(int(t) for t in got["tokens"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ServerIdentityError(
            f"{at}: cannot tokenize a probe on {model} ({type(exc).__name__}: {exc}); the "
            "token check needs vLLM's /tokenize"
        ) from None
    if ids != want:
        first = next(
            (k for k, (a, b) in enumerate(zip(ids, want, strict=False)) if a != b),
            min(len(ids), len(want)),
        )
        raise ServerIdentityError(
            f"{at}: {model} tokenizes differently from the target {expected.label} (probe "
            f"of {len(want)} tokens, {len(ids)} served, first difference at "
            f"token {first}): it is another model or tokenizer"
        )
