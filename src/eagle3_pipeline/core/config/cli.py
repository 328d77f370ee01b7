"""The command line every stage shares: ``[--params FILE] [--conf-dir DIR] [key=value ...]``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from eagle3_pipeline.core.config.compose import DEFAULT_CONF_DIR, load_config
from eagle3_pipeline.core.config.schema import Config
from eagle3_pipeline.core.errors import ConfigError


class _StageParser(argparse.ArgumentParser):
    """A stage's parser whose epilog (the keys it reads, each looked up in the schema) is
    built only when help is printed, not on every run of the stage."""

    def __init__(self, *args: Any, keys: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.keys = keys

    def format_help(self) -> str:
        from eagle3_pipeline.core.config.help import keys_help  # text only: not a stage dep

        self.epilog = (keys_help(self.keys) + "\n" if self.keys else "") + (
            "Examples:\n"
            f"  python -m {self.prog} --params params.yaml      # what dvc.yaml runs\n"
            f"  python -m {self.prog} train.epochs=1 model=tiny_llama   # compose conf/ + overrides\n"
        )
        return super().format_help()


def stage_argparser(
    prog: str, description: str, keys: list[str] | None = None
) -> argparse.ArgumentParser:
    """The command line every stage shares: ``[--params FILE] [key=value ...]``; its help
    lists ``keys`` (the stage's input view) from the schema."""
    parser = _StageParser(
        prog=prog,
        description=description,
        keys=keys,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--params",
        metavar="FILE",
        help="read this composed snapshot (params.yaml) instead of composing conf/",
    )
    parser.add_argument(
        "--conf-dir", default=DEFAULT_CONF_DIR, help="Hydra config directory (default: conf)"
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. train.samples=100")
    return parser


def config_from_cli(
    prog: str,
    description: str,
    argv: list[str] | None = None,
    stage: str | None = None,
    keys: list[str] | None = None,
) -> tuple[Config, argparse.Namespace]:
    """Parse a stage's command line and load its config; exit 2 with one line on error,
    which names ``stage`` (a stage's line reads like its other errors). ``keys``: what
    ``--help`` lists."""
    parser = stage_argparser(prog, description, keys)
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.overrides, params=args.params, conf_dir=args.conf_dir)
    except ConfigError as exc:
        print(f"error: {stage or 'config'}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return cfg, args
