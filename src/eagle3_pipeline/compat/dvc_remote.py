"""Which workspace file a DVC remote lacks: the DVC internals ``eagle3-remote`` reads.

Why: ``dvc pull`` from a remote that lacks an object prints the object's md5 and the
remote's path (``failed to transfer '<md5>'``), never the workspace file it stands for, and
a local-directory remote that is not mounted reads as an empty remote: "Everything is up to
date" plus a list of missing files. Someone pulling hidden states onto a second machine
needs the opposite: which output (``data/hidden_states/hs_12.safetensors`` of stage
``extract``) is missing, and where its object should be.

DVC has no public API for "what does this remote hold of ``dvc.lock``", so this module
reads the pieces DVC's own ``push``/``pull``/``status -c`` use: ``repo.cloud.get_remote``
(the remote's name, path and filesystem), ``repo.cloud.get_remote_odb`` (its object
database), each locked output's ``hash_info``, a directory output's listing
(``dvc_data``'s ``Tree.load``, from the local cache or else from the remote) and
``HashFileDB.oids_exist``. ``tests/compat/test_compat.py`` checks that they are there and
``tests/tools/test_remote.py`` uses them on real repositories (and shows the ``dvc push``
behaviour :func:`send_absent` works around), so both fail when DVC changes them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class RemoteProblem(RuntimeError):
    """A remote that cannot be checked (none configured, unreachable, not a cache):
    its message is one line that says what to do."""


@dataclass(frozen=True)
class RemoteInfo:
    """A configured DVC remote: its name and where its objects live."""

    name: str
    url: str


@dataclass(frozen=True)
class Wanted:
    """One object a locked output needs: the workspace file it stands for (relative to the
    repository root), the stage that writes it, and the object's id (md5, ``.dir`` for a
    directory's listing)."""

    path: str
    stage: str
    oid: str
    hash_name: str
    size: int | None = None


@dataclass(frozen=True)
class Absent:
    """A wanted object the remote does not hold, and whether this workspace's cache has it
    (then ``dvc push`` from here mends it)."""

    wanted: Wanted
    url: str
    in_local_cache: bool


@contextmanager
def open_repo(root: Path) -> Iterator[Any]:
    """DVC's ``Repo`` at ``root`` (closed on exit); one line when ``root`` is not one."""
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    try:
        repo = Repo(str(root))
    except NotDvcRepoError:
        raise RemoteProblem(
            f"{root} is not a DVC repository (no .dvc/): run this in the pipeline's clone"
        ) from None
    try:
        yield repo
    finally:
        repo.close()


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (DVC's span several: a hint, a pip command)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def remote_info(repo: Any, name: str | None) -> RemoteInfo:
    """The remote ``name`` (or the default one), as DVC's own commands resolve it."""
    from dvc.config import NoRemoteError, RemoteNotFoundError
    from dvc.exceptions import DvcException

    try:
        remote = repo.cloud.get_remote(name)
    except NoRemoteError:
        raise RemoteProblem(
            f"no DVC remote is set in {repo.root_dir}/.dvc/config: add one with "
            "`dvc remote add -d store <dir or url>`, or name one with --remote"
        ) from None
    except RemoteNotFoundError:
        raise RemoteProblem(
            f"no DVC remote named {name!r} in {repo.root_dir}/.dvc/config: "
            "`dvc remote list` shows the names"
        ) from None
    except ImportError as exc:  # s3:// without the dvc-s3 plugin installed, for one
        raise RemoteProblem(
            f"remote {name or '(the default)'!r}: {one_line(exc)}: pip install 'dvc[<scheme>]' "
            "(s3, gs, azure, ssh, ...)"
        ) from None
    except DvcException as exc:
        raise RemoteProblem(f"remote {name or '(the default)'!r}: {one_line(exc)}") from None
    return RemoteInfo(name=remote.name, url=remote.fs.unstrip_protocol(remote.path))


def check_reachable(repo: Any, info: RemoteInfo) -> None:
    """Raise a one-line :class:`RemoteProblem` when the remote's root cannot be listed:
    a directory that is not there (an unmounted share) or a cloud error (credentials,
    network). A reachable remote that was never pushed to is reported object by object."""
    remote = repo.cloud.get_remote(info.name)
    try:
        there = remote.fs.exists(remote.path)
    except Exception as exc:  # noqa: BLE001 -- any filesystem's failure, as one line
        raise RemoteProblem(
            f"remote {info.name!r} at {info.url} is unreachable: {one_line(exc)}: check the "
            "credentials and the network, or `dvc remote modify` its settings"
        ) from None
    if not there:
        why = (
            "that path does not exist (a share not mounted on this machine?); mount it, or"
            if remote.fs.protocol == "local"
            else "nothing is there (no server answered, or the path is wrong);"
        )
        raise RemoteProblem(
            f"remote {info.name!r} at {info.url} is unreachable: {why} point the remote at "
            f"the right place: `dvc remote modify {info.name} url <dir or url>`"
        )


def _odb(repo: Any, info: RemoteInfo, hash_name: str) -> Any:
    from dvc.exceptions import DvcException

    try:
        return repo.cloud.get_remote_odb(info.name, "check", hash_name=hash_name)
    except DvcException as exc:
        raise RemoteProblem(f"remote {info.name!r} at {info.url}: {one_line(exc)}") from None


def _listing(repo: Any, odb: Any, hash_info: Any) -> Any | None:
    """A directory output's listing, from the local cache, else from the remote; None
    when neither has it."""
    from dvc_data.hashfile.tree import Tree

    for source in (repo.cache.local, odb):
        if source.exists(hash_info.value):
            return Tree.load(source, hash_info)
    return None


def wanted_objects(
    repo: Any, info: RemoteInfo, stages: Iterable[str] = ()
) -> tuple[list[Wanted], list[str]]:
    """Every object the cached outputs of ``dvc.lock`` need (only ``stages`` when given),
    a directory's listing first, then its files; and the stages that have not run (no
    lock entry: nothing of theirs to hold)."""
    only = set(stages)
    known = {stage.addressing for stage in repo.index.stages}
    for name in sorted(only - known):
        raise RemoteProblem(
            f"no stage named {name!r} in {repo.root_dir}/dvc.yaml: the stages are "
            f"{', '.join(sorted(known))}"
        )
    wanted: list[Wanted] = []
    not_run: list[str] = []
    for stage in repo.index.stages:
        name = stage.addressing
        if only and name not in only:
            continue
        for out in stage.outs:
            if not out.use_cache:
                continue
            hi = out.hash_info
            rel = os.path.relpath(out.fs_path, repo.root_dir)
            if not hi or not hi.value:
                not_run.append(f"{name} ({rel})")
                continue
            size = out.meta.size if out.meta is not None else None
            wanted.append(Wanted(rel, name, hi.value, hi.name, size))
            if not hi.isdir:
                continue
            tree = _listing(repo, _odb(repo, info, hi.name), hi)
            if tree is None:
                continue  # the listing itself is absent; it is reported as the directory
            for key, meta, entry in tree:
                wanted.append(
                    Wanted(
                        os.path.join(rel, *key),
                        name,
                        entry.value,
                        entry.name or hi.name,
                        meta.size if meta is not None else None,
                    )
                )
    return wanted, not_run


def absent_objects(
    repo: Any,
    info: RemoteInfo,
    wanted: list[Wanted],
    jobs: int = 4,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[Absent]:
    """The wanted objects the remote does not hold, in ``wanted``'s order. ``progress``
    gets DVC's ``(phase, total, done)`` while a large remote is listed."""
    absent: list[Absent] = []
    by_hash: dict[str, list[Wanted]] = {}
    for w in wanted:
        by_hash.setdefault(w.hash_name, []).append(w)
    for hash_name, group in by_hash.items():
        odb = _odb(repo, info, hash_name)
        local = repo.cache.legacy if hash_name == "md5-dos2unix" else repo.cache.local
        oids = {w.oid for w in group}
        if progress is None:
            held = set(odb.oids_exist(oids, jobs=jobs))
        else:
            held = set(odb.oids_exist(oids, jobs=jobs, progress=progress))
        for w in group:
            if w.oid not in held:
                url = odb.fs.unstrip_protocol(odb.oid_to_path(w.oid))
                absent.append(Absent(w, url, local.exists(w.oid)))
    order = {id(w): i for i, w in enumerate(wanted)}
    return sorted(absent, key=lambda a: order[id(a.wanted)])


def send_absent(repo: Any, info: RemoteInfo, absent: Iterable[Absent]) -> int:
    """Push the absent files this clone's cache holds, object by object; the count sent.

    Why not ``dvc push``: it treats a directory whose listing (``.dir``) is on the remote
    as complete -- the listing is pushed last, so normally it is -- and it skips whatever
    its remote index (under DVC's site cache dir) remembers. A file deleted from the
    remote since is then never sent again ("Everything is up to date"). Here the index
    is dropped and each absent file object is sent by its own id."""
    from dvc_data.hashfile.db import get_index
    from dvc_data.hashfile.hash_info import HashInfo

    objs = [
        HashInfo(a.wanted.hash_name, a.wanted.oid)
        for a in absent
        if a.in_local_cache and not a.wanted.oid.endswith(".dir")
    ]
    if not objs:
        return 0
    for hash_name in {a.wanted.hash_name for a in absent if a.in_local_cache}:
        index = get_index(_odb(repo, info, hash_name))
        try:
            index.clear()
        finally:
            index.close()
    result = repo.cloud.push(objs, remote=info.name)
    return len(result.transferred)
