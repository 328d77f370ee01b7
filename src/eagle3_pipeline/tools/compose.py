"""Recompose ``params.yaml`` from ``conf/`` (+ overrides), exactly as ``dvc exp run`` does.

``dvc repro`` never composes ``conf/``: after editing ``conf/``, run ``eagle3-compose``
(or ``python -m eagle3_pipeline.tools.compose``) so that ``params.yaml`` -- what DVC tracks and
what stages read -- matches it. ``--check`` exits 1 when ``params.yaml`` is out of date.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eagle3_pipeline.core.config import (
    DEFAULT_CONF_DIR,
    DEFAULT_PARAMS,
    ConfigError,
    check_composed,
    compose,
)
from eagle3_pipeline.core.io import atomic_write_text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="eagle3-compose",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=tiny_llama")
    parser.add_argument("--conf-dir", default=DEFAULT_CONF_DIR)
    parser.add_argument("--out", default=DEFAULT_PARAMS, help="default: params.yaml")
    parser.add_argument("--check", action="store_true", help="only check that --out is in sync")
    args = parser.parse_args(argv)
    from omegaconf import OmegaConf

    try:
        node = compose(args.overrides, args.conf_dir)
        text = OmegaConf.to_yaml(node)  # what DVC writes (compose_yaml)
        check_composed(node)  # the cross-key checks too
    except ConfigError as exc:
        print(f"error: config: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    out = Path(args.out)
    if args.check:
        current = out.read_text(encoding="utf-8") if out.is_file() else ""
        if current != text:
            print(
                f"{out} is out of sync with {args.conf_dir}/: run eagle3-compose", file=sys.stderr
            )
            raise SystemExit(1)
        print(f"{out} is in sync with {args.conf_dir}/")
        return
    atomic_write_text(out, text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
