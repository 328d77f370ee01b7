"""``eagle3-remote check|push|pull``: DVC's own transfer commands, checked against
``dvc.lock`` so that a missing object is named by its workspace file.

``check`` reads the remote only (nothing is transferred). ``pull`` checks first and
downloads nothing when the remote lacks an object (a half-pulled workspace is worse than
none). ``push`` runs ``dvc push`` and then checks that every object arrived, so a clone
whose cache lacks an output (another node ran that stage) is named, not hidden behind a
warning. Every failure is one line and exit status 1.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from eagle3_pipeline.compat.dvc_remote import RemoteProblem
from eagle3_pipeline.tools.remote.check import (
    RemoteReport,
    absent_line,
    check_remote,
    send_what_is_absent,
    summary_line,
)

EPILOG = """examples:
  eagle3-remote check                 # does the default remote hold what dvc.lock needs?
  eagle3-remote push                  # dvc push, then that check
  eagle3-remote pull -r store         # that check, then dvc pull from remote 'store'
  eagle3-remote check --all extract   # every object stage extract's outputs lack
"""


def _report(args: argparse.Namespace) -> RemoteReport:
    report = check_remote(args.repo, args.remote, args.stages, show_progress=True)
    for stage in report.not_run:
        print(f"note: stage {stage} has not run: nothing of it to check", file=sys.stderr)
    return report


def _fail(report: RemoteReport, every: bool) -> int:
    lines = [absent_line(report.remote, a) for a in report.absent] if every else []
    for line in lines[:-1]:
        print(line, file=sys.stderr)
    print(f"error: {lines[-1] if lines else summary_line(report)}", file=sys.stderr)
    return 1


def _dvc(args: argparse.Namespace, verb: str) -> int:
    cmd = [sys.executable, "-m", "dvc", verb]
    if args.remote:
        cmd += ["-r", args.remote]
    return subprocess.run([*cmd, *args.stages], cwd=args.repo, check=False).returncode


def run(args: argparse.Namespace) -> int:
    """The subcommand; its exit status."""
    if args.command == "pull":
        report = _report(args)
        if not report.ok:
            return _fail(report, args.all)
        rc = _dvc(args, "pull")
        if rc:
            print(f"error: dvc pull exited {rc} (its output is above)", file=sys.stderr)
        return rc
    pushed = 0
    if args.command == "push":
        try:
            before = check_remote(args.repo, args.remote, args.stages)
        except RemoteProblem:
            before = None  # e.g. a new local remote: `dvc push` creates it, or says why
        if before is not None and not before.ok:
            sent = send_what_is_absent(args.repo, before)
            if sent:
                print(f"sent {sent} object(s) the remote lacked", file=sys.stderr)
        pushed = _dvc(args, "push")
    report = _report(args)
    if not report.ok:
        return _fail(report, args.all)
    if pushed:
        print(f"error: dvc push exited {pushed} (its output is above)", file=sys.stderr)
        return pushed
    print(summary_line(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="eagle3-remote",
        description="Whether a DVC remote holds every cached output of this clone's "
        "dvc.lock, named by workspace file; push and pull that say which file did not "
        "travel. One line and exit 1 on any failure.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "command",
        choices=("check", "push", "pull"),
        help="check: compare only; push: dvc push, then check; pull: check, then dvc pull",
    )
    ap.add_argument("stages", nargs="*", help="only these stages' outputs (default: all)")
    ap.add_argument("-r", "--remote", help="the remote's name (default: DVC's default remote)")
    ap.add_argument("--repo", type=Path, default=Path("."), help="the clone (default: .)")
    ap.add_argument("--all", action="store_true", help="list every missing object, not one")
    args = ap.parse_args(argv)
    try:
        return run(args)
    except RemoteProblem as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
