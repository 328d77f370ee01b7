"""Compare a DVC remote with this clone's ``dvc.lock``: a :class:`RemoteReport`, and the
one line a user acts on when the remote lacks something.

Why: the artifacts of one run travel between machines through a DVC remote (hidden states
extracted on one node, trained on another, the draft pulled where it is served). When an
object did not travel, DVC names its md5; the user needs the workspace file, the stage
that writes it and what to run: push from the machine that has it, or rerun the stage.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from eagle3_pipeline.compat.dvc_remote import (
    Absent,
    RemoteInfo,
    RemoteProblem,
    absent_objects,
    check_reachable,
    one_line,
    open_repo,
    remote_info,
    send_absent,
    wanted_objects,
)

MIB = 1024 * 1024


@dataclass(frozen=True)
class RemoteReport:
    """What the remote holds of the locked cached outputs."""

    remote: RemoteInfo
    objects: int = field(metadata={"help": "objects the locked outputs need"})
    size_bytes: int = field(metadata={"help": "their total size, as dvc.lock records it"})
    stages: tuple[str, ...] = field(metadata={"help": "stages whose outputs were checked"})
    absent: tuple[Absent, ...] = field(metadata={"help": "needed objects the remote lacks"})
    not_run: tuple[str, ...] = field(metadata={"help": "stages with no lock entry yet"})

    @property
    def ok(self) -> bool:
        return not self.absent


def check_remote(
    root: Path, name: str | None = None, stages: Iterable[str] = (), show_progress: bool = False
) -> RemoteReport:
    """Check that remote ``name`` (the default remote when None) holds every object the
    cached outputs of ``root``'s ``dvc.lock`` need (only ``stages``' when given). Raises
    :class:`~eagle3_pipeline.compat.dvc_remote.RemoteProblem` when it cannot be checked.
    ``show_progress``: a bar on a terminal's stderr while the remote is listed (millions of
    hidden-state files on a bucket take a while)."""
    with open_repo(root) as repo:
        info = remote_info(repo, name)
        check_reachable(repo, info)
        try:
            wanted, not_run = wanted_objects(repo, info, stages)
            if show_progress:
                with _Bar(f"checking remote {info.name!r}") as bar:
                    absent = absent_objects(repo, info, wanted, progress=bar.update_to)
            else:
                absent = absent_objects(repo, info, wanted)
        except OSError as exc:  # a remote lost mid-listing (network, an unmounted share)
            raise RemoteProblem(
                f"remote {info.name!r} at {info.url} failed while being read: {one_line(exc)}"
            ) from None
    dirs = {w.path for w in wanted if w.oid.endswith(".dir")}
    return RemoteReport(
        remote=info,
        objects=len(wanted),
        size_bytes=sum(w.size or 0 for w in wanted if w.path not in dirs),
        stages=tuple(dict.fromkeys(w.stage for w in wanted)),
        absent=tuple(absent),
        not_run=tuple(not_run),
    )


class _Bar:
    """tqdm driven by DVC's ``(phase, total, done)`` callback; silent off a terminal."""

    def __init__(self, desc: str) -> None:
        from tqdm import tqdm

        self._bar = tqdm(desc=desc, unit="obj", leave=False, disable=None)

    def update_to(self, phase: str, total: int, done: int) -> None:
        self._bar.set_postfix_str(phase, refresh=False)
        self._bar.total = total
        self._bar.n = done
        self._bar.refresh()

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.close()


def send_what_is_absent(root: Path, report: RemoteReport) -> int:
    """Send the objects ``report`` found absent that this clone's cache holds (inside a
    directory ``dvc push`` believes complete, too); the count sent."""
    with open_repo(root) as repo:
        return send_absent(repo, report.remote, report.absent)


def absent_line(remote: RemoteInfo, a: Absent) -> str:
    """One absent object as the line a user acts on: the workspace file, its stage, the
    object's place on the remote, and the command that mends it."""
    w = a.wanted
    what = f"{w.path}/ (its file listing)" if w.oid.endswith(".dir") else w.path
    if a.in_local_cache:
        fix = "this clone's cache has it: `eagle3-remote push`"
    else:
        fix = (
            f"this clone's cache lacks it too: push from the machine that ran stage "
            f"{w.stage!r}, or rerun it here: `dvc repro {w.stage}`"
        )
    return (
        f"remote {remote.name!r} lacks {what} (output of stage {w.stage!r}, object {a.url}): {fix}"
    )


def summary_line(report: RemoteReport) -> str:
    """The report in one line: all held, or the first absent object and how many more."""
    r = report.remote
    if report.ok:
        return (
            f"remote {r.name!r} at {r.url} holds every cached output of dvc.lock: "
            f"{report.objects} objects, {report.size_bytes / MIB:.1f} MiB, "
            f"stages {', '.join(report.stages) or '(none)'}"
        )
    line = absent_line(r, report.absent[0])
    more = len(report.absent) - 1
    if more:
        line += f" (and {more} more of {report.objects}: `eagle3-remote check --all` lists them)"
    return line
