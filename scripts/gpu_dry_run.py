#!/usr/bin/env python3
"""The GPU proof's dry run on this CPU machine, in a copy of the GPU machine's Python.

Why: an ImportError on the GPU machine costs a lent machine's minutes, so the wheel list
(scripts/gpu_wheels.py) is proved here first. This script builds an interpreter that holds
only what the GPU machine has preinstalled plus the wheels -- a bare ``venv`` (no system
site-packages) that sees, through one ``.pth`` file, links to the folders of exactly the
:data:`gpu_wheels.PREINSTALLED` distributions installed in this environment (torch and
transformers included) -- downloads the wheels for this Python's version, installs them
with the very command the device runs, and runs ``scripts/gpu_proof.sh hardware=cpu`` there
with ``PYTHONPATH=<site>:$PWD/src``. Run it with the project's environment:

    .venv/bin/python scripts/gpu_dry_run.py [--dir DIR] [--wheels DIR] [proof overrides...]

What it cannot copy: the GPU machine's own versions (torch 2.11, transformers 5.17 there;
here whatever this environment has) and anything it has preinstalled that this one lacks.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_wheels import PREINSTALLED, ROOT, canonical  # noqa: E402

Prefix = tuple[str, ...]


def owners() -> dict[Prefix, set[str]]:
    """Every path prefix under site-packages -> the distributions with files under it."""
    out: dict[Prefix, set[str]] = {}
    for dist in md.distributions():
        name = canonical(dist.metadata["Name"] or "")
        for f in dist.files or []:
            parts = Path(f).parts
            if not parts or parts[0] == "..":
                continue  # scripts in bin/, not importable
            for k in range(1, len(parts) + 1):
                out.setdefault(parts[:k], set()).add(name)
    return out


def link_preinstalled(site: Path, dest: Path) -> int:
    """Links in ``dest`` to what the preinstalled distributions own in ``site``: a whole
    folder when only they own it, else a real folder with links to their entries (a
    namespace such as ``nvidia/`` shared with a package the GPU machine lacks)."""
    own = owners()
    children: dict[Prefix, set[Prefix]] = {}
    for prefix in own:
        children.setdefault(prefix[:-1], set()).add(prefix)
    linked = 0

    def place(prefix: Prefix) -> None:
        nonlocal linked
        mine = own[prefix] & PREINSTALLED
        if not mine:
            return
        src = site.joinpath(*prefix)
        if not (src.exists() or src.is_symlink()):
            return
        target = dest.joinpath(*prefix)
        if own[prefix] <= PREINSTALLED or src.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(src)
            linked += 1
            return
        for child in sorted(children.get(prefix, ())):
            place(child)

    for top in sorted(children.get((), ())):
        place(top)
    return linked


def run(cmd: list[str], **kw: object) -> None:
    proc = subprocess.run(cmd, check=False, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise SystemExit(f"error: gpu_dry_run: {' '.join(cmd[:4])} ... exit code {proc.returncode}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dir", help="where to build the copy (default: a new temp folder)")
    parser.add_argument("--wheels", help="wheels already downloaded for this Python (a folder)")
    parser.add_argument("--setup-only", action="store_true", help="build the copy, run nothing")
    args, proof_args = parser.parse_known_args(argv)
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        print("error: gpu_dry_run: run it with the project's .venv/bin/python", file=sys.stderr)
        return 2
    root = Path(args.dir or tempfile.mkdtemp(prefix="eagle3-gpu-sim.")).resolve()
    pyver = f"{sys.version_info.major}.{sys.version_info.minor}"
    t0 = time.perf_counter()

    wheels = Path(args.wheels).resolve() if args.wheels else root / "whl"
    if not args.wheels:
        run([sys.executable, str(ROOT / "scripts/gpu_wheels.py"), "--python-version", pyver,
             "--dest", str(wheels)])  # fmt: skip
    venv = root / "venv"
    run([sys._base_executable, "-m", "venv", str(venv)])  # type: ignore[attr-defined]
    py = venv / "bin" / "python3"
    venv_site = Path(
        subprocess.check_output([str(py), "-c", "import site; print(site.getsitepackages()[0])"])
        .decode()
        .strip()
    )
    # named like the GPU machine's folder: dill (datasets' fingerprints) pickles a module
    # by reference only when its path says site-packages (or lies under sys.prefix)
    pre = root / "preinstalled" / "site-packages"
    pre.mkdir(parents=True, exist_ok=True)
    this_site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    n = link_preinstalled(this_site, pre)
    (venv_site / "gpu_preinstalled.pth").write_text(f"import site; site.addsitedir({str(pre)!r})\n")
    print(f"gpu_dry_run: {n} links to the preinstalled distributions in {pre}", flush=True)

    site = root / "site"
    install = [str(py), "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    install += ["--no-cache-dir", "--upgrade", "--target", str(site)]
    run(install + sorted(str(w) for w in wheels.glob("*.whl")))
    t_setup = time.perf_counter() - t0
    print(f"gpu_dry_run: the copy is ready in {t_setup:.0f} s: {root}", flush=True)

    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{site}{os.pathsep}{ROOT / 'src'}"
    env["PYTHONNOUSERSITE"] = "1"
    if args.setup_only:
        print(f"PATH={env['PATH'].split(os.pathsep)[0]}:$PATH PYTHONPATH={env['PYTHONPATH']}")
        return 0
    t1 = time.perf_counter()
    rc = subprocess.run(
        [str(ROOT / "scripts/gpu_proof.sh"), "hardware=cpu", *proof_args], env=env, check=False
    ).returncode
    print(f"gpu_dry_run: the proof took {time.perf_counter() - t1:.0f} s, exit code {rc}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
