#!/usr/bin/env python3
"""Download, here, the wheels the GPU proof needs on the lent GPU machine.

That machine (one H200, no network; Python 3.12 with torch, transformers and many other
packages preinstalled, listed in :data:`PREINSTALLED`) has none of the packages below, and
nothing can be fetched there: they travel with the working tree as wheels, at most 64 MiB
per call together with the tree. So this script, run with the project's environment
(``.venv/bin/python scripts/gpu_wheels.py``), takes :data:`ROOTS` -- the distributions the
stages import on the proof's path (``scripts/gpu_proof.py``: ``extract.backend=hf``,
``validate.vllm=false``, no DVC command) -- adds every distribution they require in turn
(their ``Requires-Dist``, markers evaluated for the target Python on Linux x86-64), drops
what the GPU machine has, pins each to the version installed here, and downloads exactly
one wheel of each into ``.whl/``. It prints the set and its size and exits 1 when the
wheels, or the wheels plus the working tree that travels with them, exceed 64 MiB.

Why the whole ``Requires-Dist`` closure and not only what the dry run imported: a module
that only the CUDA path imports would be missed by a CPU dry run; the closure costs a few
MiB more and leaves nothing to chance.

There: ``python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir
--upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/src``.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_MIB = 64.0  # what one device call carries: the working tree and the wheels together

# What the stages import on the proof's path that the GPU machine lacks (the quick test
# tests/preflight/test_gpu_proof.py checks that these plus PREINSTALLED cover every third-party
# import reachable from the stages).
ROOTS = (
    "speculators",  # the draft model, its data format and trainer pieces
    "hydra-core",  # composing conf/ (every stage)
    "omegaconf",  # the config schema's merge; train's params file for torchrun
    "antlr4-python3-runtime",  # omegaconf's and hydra's grammar runtime
    "datasets",  # the prepared rows (prepare writes them, extract and train read them)
    "dvclive",  # train's and validate's curves and summaries
)

# The GPU machine's Python packages (/opt/torch/.venv, Python 3.12), as the device
# machine's KINDS.md lists them (image 'cuda', read 2026-11-17).
PREINSTALLED = frozenset(
    """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
    diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
    frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
    hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
    jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
    linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl
    meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
    narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
    nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
    nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
    nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime
    onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
    orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
    prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
    pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
    pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich
    sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
    sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
    statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
    tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
    torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions
    typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
    """.split()
)

# pip matches a manylinux_2_N tag exactly: the machine's (glibc 2.39) common ones first;
# the extra ones are tried only for a package none of the first matched.
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
MORE_PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (24, 31, 34, 35, 36, 38, 39))


class WheelError(Exception):
    """A failure the user fixes: one line saying what to do."""


def canonical(name: str) -> str:
    """PEP 503 normalized name (``ruamel.yaml`` -> ``ruamel-yaml``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def marker_env(python_version: str) -> dict[str, str]:
    """PEP 508 marker values of the target interpreter: CPython on Linux x86-64."""
    return {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython",
        "implementation_version": f"{python_version}.0",
        "platform_python_implementation": "CPython",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "platform_release": "",
        "platform_version": "",
        "sys_platform": "linux",
        "os_name": "posix",
    }


def wheel_set(python_version: str = "3.12") -> dict[str, str]:
    """``{distribution: version}`` to download: the closure of :data:`ROOTS` over their
    requirements (with the extras asked for), less :data:`PREINSTALLED`, each at the
    version installed in this interpreter's environment."""
    from packaging.requirements import Requirement

    env = marker_env(python_version)
    pinned: dict[str, str] = {}
    extras_seen: dict[str, set[str]] = {}
    todo: list[tuple[str, frozenset[str]]] = [(r, frozenset()) for r in ROOTS]
    while todo:
        name, extras = todo.pop()
        key = canonical(name)
        if key in PREINSTALLED:
            continue
        wanted = {""} | set(extras)
        if key in extras_seen and wanted <= extras_seen[key]:
            continue
        extras_seen.setdefault(key, set()).update(wanted)
        try:
            dist = md.distribution(key)
        except md.PackageNotFoundError:
            raise WheelError(
                f"{name} is needed on the GPU machine but not installed here: run this with "
                "the project's environment (.venv/bin/python, after `pip install -e .`)"
            ) from None
        pinned[key] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not any(
                req.marker.evaluate({**env, "extra": e}) for e in wanted
            ):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return dict(sorted(pinned.items()))


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=False
    )


def _last_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.startswith("ERROR")]
    return lines[-1] if lines else f"pip exit code {proc.returncode}"


def download(name: str, version: str, dest: Path, python_version: str) -> Path:
    """One wheel of ``name==version`` for the target Python into ``dest``: a binary
    wheel for its manylinux tags, else (a pure-Python project that publishes only a
    source archive, like antlr4-python3-runtime 4.9.3) one built here, if it is pure."""
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        spec = f"{name}=={version}"
        common = ["--no-deps", "--only-binary=:all:", "--python-version", python_version]
        common += ["--implementation", "cp", "-d", tmp, "-q"]
        built = False
        for platforms in (PLATFORMS, PLATFORMS + MORE_PLATFORMS):
            plat = [a for p in platforms for a in ("--platform", p)]
            proc = _pip("download", *common, *plat, spec)
            if proc.returncode == 0:
                break
        else:
            proc = _pip("wheel", "--no-deps", "-q", "-w", tmp, spec)
            if proc.returncode != 0:
                raise WheelError(
                    f"{spec}: no wheel found and none could be built ({_last_error(proc)})"
                )
            built = True
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise WheelError(f"{spec}: expected one wheel, pip left {[w.name for w in wheels]}")
        wheel = wheels[0]
        if built and not wheel.name.endswith("-none-any.whl"):  # built for this Python only
            raise WheelError(f"{spec}: only a source archive, and it builds a binary wheel")
        return Path(shutil.move(str(wheel), dest / wheel.name))


def tree_bytes() -> int:
    """The working tree that travels with the wheels: tracked and untracked-not-ignored
    files (what the device call sends)."""
    proc = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        return 0
    total = 0
    for rel in proc.stdout.decode().split("\0"):
        p = ROOT / rel
        if rel and p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Then, on the GPU machine: scripts/gpu_proof.sh (README: 'GPU checks').",
    )
    parser.add_argument(
        "--python-version", default="3.12", help="the target interpreter (default 3.12)"
    )
    parser.add_argument("--dest", default=str(ROOT / ".whl"), help="where (default: .whl/)")
    parser.add_argument("--list", action="store_true", help="print the set; download nothing")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python_version):
        print(
            f"error: gpu_wheels: --python-version={args.python_version}: give X.Y, e.g. 3.12",
            file=sys.stderr,
        )
        return 2
    try:
        wanted = wheel_set(args.python_version)
        if args.list:
            for name, version in wanted.items():
                print(f"{name}=={version}")
            return 0
        dest = Path(args.dest)
        dest.mkdir(parents=True, exist_ok=True)
        for old in dest.glob("*.whl"):  # one version of each: two stop the whole install
            old.unlink()
        sizes: dict[str, int] = {}
        for name, version in wanted.items():
            wheel = download(name, version, dest, args.python_version)
            sizes[wheel.name] = wheel.stat().st_size
            print(f"{wheel.stat().st_size / 2**20:7.2f} MiB  {wheel.name}", flush=True)
    except WheelError as exc:
        print(f"error: gpu_wheels: {exc}", file=sys.stderr)
        return 1
    total = sum(sizes.values()) / 2**20
    tree = tree_bytes() / 2**20
    print(
        f"{len(sizes)} wheels for Python {args.python_version}: {total:.2f} MiB in {dest}; "
        f"with the working tree ({tree:.2f} MiB): {total + tree:.2f} of {LIMIT_MIB:.0f} MiB"
    )
    if total > LIMIT_MIB or total + tree > LIMIT_MIB:
        print(
            f"error: gpu_wheels: over the {LIMIT_MIB:.0f} MiB a device call carries: make an "
            "import the proof does not need lazy instead of shipping its package",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    raise SystemExit(main())
