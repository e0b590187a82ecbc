"""Warm working copies: a task starts on a tree left by an earlier task of the same repository, not a clone.

Per remote there is one bare mirror under ``{git_cache_dir}/mirrors``, refreshed with ``git fetch`` under a
file lock (several worker processes share a host). A finished task's working tree is not deleted: it is
renamed into ``{workspaces_dir}/.idle/{remote key}/`` and the next task of that remote renames it to its own
``{workspaces_dir}/{uuid}`` (a rename is atomic: two processes never take the same copy, no lock needed).

The agent had the tree, and its ``.git``, in its hands: nothing of either is trusted by the next task, nor by the
worker's own git, which never reads that ``.git`` (worker/gitdirs.py). The worker's git directory and the agent's
``.git`` are made anew for every task (objects come from the mirror through ``alternates``), and the index
the worker switches with lives in ``{git_cache_dir}/indexes``, out of the sandbox's reach: with it,
``checkout -f`` rewrites exactly the files that differ (ctime and inode give a tampered file away), and a
checkpoint's ``git add -A`` re-hashes only the files that changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import filelock
import structlog

from contexts.filelocks import file_lock
from sandbox import layers
from sandbox.setup import WORKER_GIT_SUFFIX
from worker.checkout import ASIDE_PREFIX, DISCARDED_PREFIX, HOME_SUFFIX
from worker.gitdirs import GitError, default_branch, mirror_heads, run_git

__all__ = ["GitCache", "default_branch", "remote_key"]

log = structlog.get_logger(__name__)

IDLE_DIR = ".idle"
MIRROR_LOCK_TIMEOUT_S = 600  # a first clone of a large repository holds the lock that long at most
EVICT_EVERY_S = 3600  # how often a host looks for warm copies and mirrors nobody used for keep_s
EVICTED_STAMP = "evicted"  # under the cache root: its mtime is the host's last look
TRASH_PREFIX = ".evicting-"
FETCHED_FILE = "tasuki-fetched.json"  # in a mirror: when its last good fetch began, and the branches it left


def remote_key(remote: str) -> str:
    """A file name for ``remote`` (credentials never appear in it: they travel in git's environment)."""
    return hashlib.sha256(remote.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class GitCache:
    """The host's mirrors and idle working copies; ``root`` is ``contexts.git_cache_dir``."""

    root: Path
    workspaces: Path
    keep_s: float = 7 * 86400  # an idle copy or a mirror unused this long is deleted (contexts.warm_copy_days)

    def mirror_path(self, remote: str) -> Path:
        """Where the bare mirror of ``remote`` lives."""
        return self.root / "mirrors" / f"{remote_key(remote)}.git"

    def index_path(self, copy: Path) -> Path:
        """The worker's own index of the working copy at ``copy`` (named after the copy's directory)."""
        return self.root / "indexes" / copy.name

    def refresh(self, remote: str, git_env: Mapping[str, str] | None) -> tuple[Path, dict[str, str]]:
        """The mirror of ``remote``, fetched since this call began, and its branches (name -> commit; ``HEAD``
        too). A fetch another process began after this call, while this one waited for the lock, serves it as
        well: tasks of one repository starting together share a fetch instead of queueing for one each. A mirror
        git cannot fetch into is discarded and cloned again."""
        asked = time.time_ns()
        mirror = self.mirror_path(remote)
        mirror.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with file_lock(mirror.with_suffix(".lock"), MIRROR_LOCK_TIMEOUT_S, mode=0o600):
            if mirror.is_dir():
                shared = _fetched_since(mirror, asked)
                if shared is not None:
                    return mirror, shared
                started = time.time_ns()
                try:
                    run_git(("fetch", "-q", "--prune", "origin"), cwd=mirror, extra_env=git_env)
                    return mirror, self._fetched(mirror, started)
                except GitError as exc:
                    log.warning("git mirror discarded; cloning it again", mirror=str(mirror), error=str(exc)[:300])
                    shutil.rmtree(mirror, ignore_errors=True)
            started = time.time_ns()
            self._clone_mirror(remote, mirror, git_env)
            return mirror, self._fetched(mirror, started)

    def _fetched(self, mirror: Path, started_ns: int) -> dict[str, str]:
        """Note a good fetch (or clone) of ``mirror`` begun at ``started_ns`` with the branches it left, for the
        processes waiting on the lock meanwhile; returns the branches."""
        heads = self.heads(mirror)
        note = mirror / FETCHED_FILE
        note.touch(mode=0o600)
        note.write_text(json.dumps({"started_ns": started_ns, "heads": heads}))
        os.utime(mirror)  # its last use, for eviction
        return heads

    def _clone_mirror(self, remote: str, mirror: Path, git_env: Mapping[str, str] | None) -> None:
        partial = mirror.with_name(f".{mirror.name}.{secrets.token_hex(4)}")
        try:
            run_git(("clone", "-q", "--bare", "--no-hardlinks", remote, str(partial)), cwd=mirror.parent,
                    extra_env=git_env)
            # A bare clone keeps no fetch refspec; branches only (not GitHub's refs/pull/*).
            run_git(("config", "remote.origin.fetch", "+refs/heads/*:refs/heads/*"), cwd=partial)
            os.rename(partial, mirror)
        finally:
            shutil.rmtree(partial, ignore_errors=True)

    def take(self, remote: str, target: Path) -> bool:
        """Move an idle working copy of ``remote`` to ``target`` (which must not exist); False if none is idle."""
        for candidate in _entries(self.workspaces / IDLE_DIR / remote_key(remote)):
            try:
                os.rename(candidate, target)
            except FileNotFoundError:
                continue  # another process took it a moment ago
            self._move_records(candidate, target)
            return True
        return False

    def give_back(self, remote: str, copy: Path) -> None:
        """A finished task's tree becomes idle for the next task of ``remote`` (deleted if it cannot be)."""
        if not copy.is_dir():
            return
        idle = self.workspaces / IDLE_DIR / remote_key(remote)
        target = idle / secrets.token_hex(8)
        try:
            idle.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.utime(copy)  # its last use, for eviction (a rename keeps a directory's mtime)
            os.rename(copy, target)
        except OSError as exc:
            log.warning("working copy not kept", error=str(exc)[:300])
            self.discard(copy)
            return
        self._move_records(copy, target)

    def discard(self, copy: Path) -> None:
        """Delete a working copy (whatever is at its path) and the worker's index of it."""
        if copy.is_symlink() or copy.is_file():
            copy.unlink()
        shutil.rmtree(copy, ignore_errors=True)
        self.drop_records(copy)

    def records(self, copy: Path) -> tuple[Path, Path]:
        """The worker's own files about the working copy at ``copy``, out of the sandbox's reach, that follow it
        from task to task: its index, and the record of the environment it holds (worker/warm_environment.py)."""
        return self.index_path(copy), self.environment_path(copy)

    def environment_path(self, copy: Path) -> Path:
        """The record of the repository environment the working copy at ``copy`` holds (absent: none kept)."""
        return self.root / "indexes" / f"{copy.name}.environment"

    def _move_records(self, copy: Path, target: Path) -> None:
        for old, new in zip(self.records(copy), self.records(target), strict=True):
            with contextlib.suppress(FileNotFoundError):
                os.rename(old, new)

    def drop_records(self, copy: Path) -> None:
        """Forget what the worker knew of the working copy at ``copy`` (deleted, or another holder's)."""
        for record in self.records(copy):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(record)

    def maybe_evict(self, now: float) -> list[Path]:
        """:meth:`evict`, at most once per ``EVICT_EVERY_S`` on this host (the processes share a stamp file)."""
        stamp = self.root / EVICTED_STAMP
        try:
            if now - stamp.stat().st_mtime < EVICT_EVERY_S:
                return []
        except FileNotFoundError:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        stamp.touch(mode=0o600)  # first: the other processes skip this round (two at once would only overlap)
        return self.evict(now)

    def evict(self, now: float) -> list[Path]:
        """Delete the idle working copies and the mirrors nobody used for ``keep_s`` seconds; returns them.

        A copy is taken away by a rename before it is deleted, so a task taking it at the same moment either
        has it whole or never sees it. A mirror goes only under its lock, held without waiting (a task refreshing
        it keeps it), and only when no idle copy of its remote is left: a recent copy means the mirror is in use.
        A running task's mirror was fetched when it started, and tasks end long before ``keep_s`` (one day at least).
        """
        gone: list[Path] = []
        cutoff = now - self.keep_s
        idle_root = self.workspaces / IDLE_DIR
        for remote_dir in _entries(idle_root):
            if remote_dir.name.startswith(TRASH_PREFIX):  # an eviction killed mid-way left it: finish the job
                self.discard(remote_dir)
                continue
            for copy in _entries(remote_dir):
                if _mtime(copy) >= cutoff:
                    continue
                trash = idle_root / f"{TRASH_PREFIX}{secrets.token_hex(8)}"
                try:
                    os.rename(copy, trash)
                except FileNotFoundError:
                    continue  # a task took it a moment ago
                self.discard(trash)
                self.drop_records(copy)
                gone.append(copy)
            with contextlib.suppress(OSError):
                remote_dir.rmdir()  # only when empty
        for mirror in _entries(self.root / "mirrors"):
            if mirror.name.startswith(TRASH_PREFIX):  # left by an eviction killed mid-way
                shutil.rmtree(mirror, ignore_errors=True)
                continue
            if mirror.suffix != ".git" or _mtime(mirror) >= cutoff:
                continue
            if any(_entries(idle_root / mirror.stem)):
                continue
            try:
                with file_lock(mirror.with_suffix(".lock"), 0, mode=0o600):
                    trash = mirror.with_name(f"{TRASH_PREFIX}{mirror.name}")
                    os.rename(mirror, trash)
                    shutil.rmtree(trash, ignore_errors=True)
                    gone.append(mirror)
            except filelock.Timeout:
                continue  # a task is refreshing it: in use
        gone += self._evict_homes(cutoff, now - EVICT_EVERY_S)
        if gone:
            log.info("unused warm copies and mirrors deleted", count=len(gone), unused_days=self.keep_s / 86400)
        return gone

    def _evict_homes(self, cutoff: float, discarded_cutoff: float) -> list[Path]:
        """Task homes (``{uuid}.home``) and set-aside leftovers whose task is long gone: unused since ``cutoff``,
        and so is the checkout beside them, if any (a worker killed before it released the checkout leaves both);
        paths discarded from a checkout whose deletion in the background stopped before ``discarded_cutoff``."""
        gone = []
        for entry in _entries(self.workspaces):
            if entry.name.startswith(DISCARDED_PREFIX):  # made by a rename, then deleted in seconds: this one was not
                stale = _mtime(entry) < discarded_cutoff
            elif entry.name.startswith(ASIDE_PREFIX):
                stale = _mtime(entry) < cutoff
            elif entry.name.endswith(HOME_SUFFIX):
                checkout = entry.with_name(entry.name.removesuffix(HOME_SUFFIX))
                stale = max(_mtime(entry), _mtime_or_zero(checkout)) < cutoff
            elif entry.name.endswith(WORKER_GIT_SUFFIX):  # the worker's git directory of a checkout
                checkout = entry.with_name(entry.name.removesuffix(WORKER_GIT_SUFFIX))
                stale = max(_mtime(entry), _mtime_or_zero(checkout)) < cutoff
            elif entry.name.endswith(HOME_SUFFIX + layers.LAYERS_SUFFIX):  # layers whose home went first
                home = entry.with_name(entry.name.removesuffix(layers.LAYERS_SUFFIX))
                stale = not home.exists() and _mtime(entry) < cutoff
            else:
                continue
            if stale:
                layers.remove_home(entry)  # a home (its layers too), or a set-aside leftover
                gone.append(entry)
        return gone

    def heads(self, mirror: Path) -> dict[str, str]:
        """The mirror's branches: name -> commit; ``HEAD`` too (the remote's default branch)."""
        return mirror_heads(mirror)


def _fetched_since(mirror: Path, asked_ns: int) -> dict[str, str] | None:
    """The branches of ``mirror``'s last good fetch if it began at ``asked_ns`` or later; None if it began
    earlier, or nothing readable says (a note torn by a crash only costs a fetch)."""
    try:
        note = json.loads((mirror / FETCHED_FILE).read_bytes())
        started, heads = int(note["started_ns"]), note["heads"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if started < asked_ns or not isinstance(heads, dict):
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in heads.items()):
        return None
    return heads


def _entries(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except FileNotFoundError:
        return []


def _mtime(path: Path) -> float:
    """``path``'s mtime; a path gone meanwhile counts as just used (it is not deleted)."""
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return float("inf")


def _mtime_or_zero(path: Path) -> float:
    """``path``'s mtime; 0 when it is not there."""
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0
