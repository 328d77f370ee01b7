"""Check an EAGLE-3 draft directory the way vLLM and speculators will read it.

Usable on its own, on any machine (no vLLM, no GPU): a draft that breaks vLLM's loading
rules otherwise fails only at serve time, or loads with silently uninitialised tensors or
on the wrong target layers. Exit status: 0 pass, 1 errors found (or warnings with
``--strict``), 2 bad arguments or an unreadable target.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from eagle3_pipeline.core.config import ConfigError, ModelConfig
from eagle3_pipeline.targets.adapter import TargetSpec, describe_target, load_target_spec

EPILOG = """\
examples:
  eagle3-check-draft data/draft --target data/target/target.json
  eagle3-check-draft DRAFT --target /models/Llama-3.1-8B --json
  eagle3-check-draft DRAFT --no-reload     # format rules only

--target takes the target stage's target.json (or a directory holding one), or a model
directory with config.json. Without it, checks against the target (hidden size, vocab,
aux ids, architecture, verifier id) and the full speculators reload are skipped.
"""


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated ints") from None


def spec_for_target_arg(arg: str) -> TargetSpec:
    """target.json, a directory holding one, or a model directory (described on the fly)."""
    path = Path(arg)
    if path.is_file():
        return load_target_spec(path)
    if (path / "target.json").is_file():
        return load_target_spec(path / "target.json")
    if (path / "config.json").is_file():
        return describe_target(path, ModelConfig(name=path.name, path=str(path)))
    raise ConfigError(f"{path}: neither target.json nor a model directory with config.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="eagle3-check-draft",
        description=__doc__.split("\n\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "draft_dir", metavar="DIR", help="the draft directory (config.json + safetensors)"
    )
    parser.add_argument(
        "--target",
        metavar="DIR_OR_JSON",
        help="target.json, a directory holding it, or the target model directory",
    )
    parser.add_argument(
        "--aux-ids",
        type=_parse_ids,
        metavar="I,J,K",
        help="layer ids the training hidden states were extracted at (default: target.json's)",
    )
    parser.add_argument(
        "--verifier-dir",
        metavar="DIR",
        help="local target directory for the speculators reload (default: target.json's path)",
    )
    parser.add_argument(
        "--no-reload",
        action="store_true",
        help="skip the speculators reload (saves about 7 s of import)",
    )
    parser.add_argument("--strict", action="store_true", help="warnings fail too")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)

    from eagle3_pipeline.validate.checkpoint import validate_checkpoint

    spec = None
    if args.target:
        try:
            spec = spec_for_target_arg(args.target)
        except ConfigError as exc:
            print(f"error: --target: {exc}", file=sys.stderr)
            return 2
    if not Path(args.draft_dir).is_dir():
        print(f"error: {args.draft_dir}: not a directory", file=sys.stderr)
        return 2
    report = validate_checkpoint(
        args.draft_dir,
        spec,
        args.aux_ids,
        verifier_dir=args.verifier_dir,
        reload=not args.no_reload,
    )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.format())
    failed = not report.ok or (args.strict and bool(report.warnings))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
