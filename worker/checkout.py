"""The task's git checkout: clone, task branch, checkpoints after steps, the final commit and push.

Checkpoints make resume work on another machine: after every step that changed files, the work is
committed on the task branch and pushed to the remote, so a worker that picks the baton up clones
the branch and finds the files exactly as the last step on disk left them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from contexts.errors import TasukiError
from worker.pushes import BackgroundPush

if TYPE_CHECKING:
    from worker.workcopy import GitCache

log = structlog.get_logger(__name__)

AUTHOR = {
    "GIT_AUTHOR_NAME": "Tasuki",
    "GIT_AUTHOR_EMAIL": "tasuki@localhost",
    "GIT_COMMITTER_NAME": "Tasuki",
    "GIT_COMMITTER_EMAIL": "tasuki@localhost",
}


# The checkout is the agent's: git run by the worker itself (with the forge credential in its environment)
# never runs anything the checkout could have planted — hooks, an fsmonitor command.
SAFE_GIT = ("-c", f"core.hooksPath={os.devnull}", "-c", "core.fsmonitor=false")


CHECKPOINT_SUBJECT = "tasuki: checkpoint after step "
RESTORED_STEP_FILE = "tasuki-restored-step"


class GitError(TasukiError):
    """A git command failed; the message holds the command and git's last line of output."""


@dataclass
class TreeState:
    """What the worker knows without asking git: ``exact`` is the commit HEAD is at since the switch (None once
    unknown)."""

    exact: str | None = None


@dataclass(frozen=True)
class Checkout:
    """A working copy in ``{workspaces_dir}/{uuid}`` on branch ``branch`` of ``remote``."""

    path: Path
    remote: str
    branch: str
    git_env: Mapping[str, str] | None = None  # credentials passed out of band (never in the remote URL)
    continues: bool = False  # the branch exists on the remote (a follow-up): start from it, not from the default
    cache: GitCache | None = None  # warm copies and mirrors of this host; None: a fresh clone per task
    pushes: BackgroundPush = field(default_factory=BackgroundPush, compare=False, repr=False)
    tree: TreeState = field(default_factory=TreeState, compare=False, repr=False)

    def git(self, *args: str, cwd: Path | None = None, check: bool = True, index: bool = False) -> str:
        """Run ``git args`` in the checkout; return stdout. ``index``: with the worker's own index."""
        env = {**(self.git_env or {}), "GIT_INDEX_FILE": str(self.index_file)} if index else self.git_env
        return run_git(args, cwd=cwd or self.path, extra_env=env, check=check)

    @property
    def index_file(self) -> Path:
        """The worker's index of the tree, kept across checkpoints (and, with a cache, across tasks): only
        files whose stat information changed are hashed again."""
        if self.cache is not None:
            return self.cache.index_path(self.path)
        return self.path / ".git" / "tasuki-checkpoint-index"

    @property
    def checkpoint_branch(self) -> str:
        """Where step checkpoints are pushed: beside the task branch, never on it (a follow-up's carry its
        own task's id: several tasks work on one pull request's branch, one after another)."""
        own = f"-{self.path.name[:8]}" if self.continues else ""
        return f"tasuki-checkpoints/{self.branch.removeprefix('tasuki/')}{own}"

    def prepare(self, *, fresh: bool = False) -> bool:
        """Make the checkout exist on the task branch; return True when it was resumed (not fresh).

        ``fresh``: the task has never run before, so no earlier attempt can have pushed anything.
        """
        if (self.path / ".git").is_dir():
            try:
                self.git("checkout", "-q", self.branch)
            except GitError:  # a crash left it half made, or it is another task's warm copy
                pass
            else:  # this task's own tree (a resume on this host): its last checkpoint goes out first
                if self._pending_marker.exists():  # in the background, like any checkpoint's push
                    commit = self._pending_marker.read_text().strip()
                    tree = self.git("rev-parse", f"{commit}^{{tree}}").strip()
                    self.pushes.start(lambda: self._push_checkpoint(commit, tree))
                return True
        heads = self._fetch()
        if fresh:
            self._switch(self._start_point())
            self.tree.exact = heads.get(self._start_point().removeprefix("origin/"))
            return False
        if self.checkpoint_branch not in heads:
            if self.branch not in heads:
                self._switch(self._start_point())
                self._restored_from(0)  # a resume that finds nothing pushed: every step's changes are gone
                return False
            # An earlier attempt pushed its final branch (and dropped its checkpoints) but died before its
            # context was completed: the branch holds the work, so continue from it.
            self._switch(f"origin/{self.branch}")  # all of the work: the end waited for every push
            return True
        self._switch(self._start_point())
        # An earlier attempt pushed checkpoints: put its files back as uncommitted changes, exactly as the
        # last step on disk left them (deleted files included), so `git diff` shows the work as before.
        checkpoint = f"origin/{self.checkpoint_branch}"
        self.git("read-tree", "-u", "--reset", checkpoint, index=True)
        self.git("reset", "-q")
        self._pushed_marker.write_text(self.git("rev-parse", f"{checkpoint}^{{tree}}"))
        step = self.git("log", "-1", "--format=%s", checkpoint).strip().removeprefix(CHECKPOINT_SUBJECT)
        self._restored_from(int(step) if step.isdigit() else 0)
        return True

    def _restored_from(self, step: int) -> None:
        (self.path / ".git" / RESTORED_STEP_FILE).write_text(f"{step}\n")

    def _fetch(self) -> dict[str, str]:
        """Have the remote's branches as ``origin/*`` (returned: name -> commit): a clone, or (with a cache) a
        warm copy on a freshly fetched mirror; a copy git cannot use is discarded and made again."""
        if self.cache is None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            run_git(("clone", "-q", "--no-hardlinks", self.remote, str(self.path)), cwd=self.path.parent,
                    extra_env=self.git_env)
            listed = self.git("for-each-ref", "--format=%(objectname) %(refname:lstrip=3)", "refs/remotes/origin")
            return {name: sha for sha, name in (line.split(" ", 1) for line in listed.splitlines())}
        mirror, heads = self.cache.refresh(self.remote, self.git_env)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self.path.exists():
            self.cache.take(self.remote, self.path)
        try:
            self.cache.new_git_dir(self.path, self.remote, mirror, heads)
        except OSError as exc:
            log.warning("working copy discarded; making a new one", error=str(exc)[:300])
            self.cache.discard(self.path)
            self.cache.new_git_dir(self.path, self.remote, mirror, heads)
        return heads

    def _switch(self, start: str) -> None:
        """Put the task branch at ``start`` and the tree exactly at its commit (untracked and ignored files
        removed), rewriting only the files that differ from the worker's index."""
        try:
            self._switch_tree(start)
        except GitError as exc:
            if self.cache is None:
                raise
            log.warning("working copy discarded; making a new one", error=str(exc)[:300])
            self.cache.discard(self.path)
            self._fetch()
            self._switch_tree(start)

    def _switch_tree(self, start: str) -> None:
        self.git("checkout", "-q", "-f", "-B", self.branch, start, index=True)
        self.git("clean", "-q", "-ffdx", index=True)
        # The agent's own git (status, diff) gets the same stat information: nothing to re-hash for it either.
        shutil.copyfile(self.index_file, self.path / ".git" / "index")

    def _start_point(self) -> str:
        """Where a new local task branch starts: the remote branch a follow-up continues, else the clone's HEAD."""
        return f"origin/{self.branch}" if self.continues else "origin/HEAD"

    def restore_last_checkpoint(self) -> None:
        """Put the working tree back exactly as the last checkpoint (made here, else pushed; else the branch's
        commit) left it, untracked files included: after a crash mid-step the tree may hold half of a call's
        effects."""
        self.settle()  # a push in flight moves its commit from pending to pushed
        pending, marker = self._pending_marker, self._pushed_marker
        if pending.exists():
            tree = f"{pending.read_text().strip()}^{{tree}}"
        else:
            tree = marker.read_text().strip() if marker.exists() else "HEAD"
        self.git("read-tree", "-u", "--reset", tree)
        self.git("clean", "-q", "-fd")
        self.git("reset", "-q")

    def restored_step(self) -> int | None:
        """The step whose checkpoint this attempt's tree was rebuilt from (0: none was on the remote); None when
        the tree is this task's own, left on this host, so no step's changes can be missing from it."""
        marker = self.path / ".git" / RESTORED_STEP_FILE
        return int(marker.read_text()) if marker.exists() else None

    def restore_told(self) -> None:
        """The model has been told what :meth:`restored_step` means for it: no later attempt tells it again."""
        (self.path / ".git" / RESTORED_STEP_FILE).unlink(missing_ok=True)

    @property
    def _pushed_marker(self) -> Path:
        """Holds the tree of the last checkpoint on the remote; absent while none was pushed."""
        return self.path / ".git" / "tasuki-checkpoint-tree"

    @property
    def _pending_marker(self) -> Path:
        """Holds the checkpoint commit being pushed; absent once it is on the remote."""
        return self.path / ".git" / "tasuki-checkpoint-pending"

    def has_changes(self) -> bool:
        """True when the working tree differs from the last commit."""
        return bool(self.git("status", "--porcelain").strip())

    def commit(self, message: str) -> bool:
        """Commit everything (if anything changed); return whether a commit was made."""
        if not self.has_changes():
            return False
        self.git("add", "-A")
        self.git("commit", "-q", "--no-verify", "-m", message)
        self.tree.exact = None
        return True

    def push(self) -> None:
        """Push the task branch to the remote and drop the checkpoints it supersedes."""
        self.pushes.wait()  # a checkpoint pushed after the deletion below would come back
        # A follow-up's branch is a pull request's: never force over commits someone else pushed meanwhile.
        force = () if self.continues else ("--force",)
        self.git("push", "-q", *force, "origin", f"HEAD:refs/heads/{self.branch}")
        if self._pushed_marker.exists():
            self.git("push", "-q", "origin", "--delete", self.checkpoint_branch, check=False)

    def checkpoint(self, step: int) -> bool:
        """Snapshot the working tree (without touching HEAD or the agent's index) and push it beside the task
        branch in the background, so another worker can resume from it; returns whether there was a new one."""
        if not self.index_file.exists():
            self.git("read-tree", "HEAD", index=True)
        self.git("add", "-A", index=True)
        tree = self.git("write-tree", index=True).strip()
        self.pushes.wait()
        marker = self._pushed_marker
        previous = marker.read_text().strip() if marker.exists() else self.git("rev-parse", "HEAD^{tree}").strip()
        if tree == previous:
            return False
        commit = self.git("commit-tree", tree, "-p", "HEAD", "-m", f"{CHECKPOINT_SUBJECT}{step}").strip()
        self._pending_marker.write_text(commit + "\n")  # a resume on this host pushes it, if this process cannot
        self.pushes.start(lambda: self._push_checkpoint(commit, tree))
        return True

    def _push_checkpoint(self, commit: str, tree: str) -> None:
        self.git("push", "-q", "--force", "origin", f"{commit}:refs/heads/{self.checkpoint_branch}")
        self._pushed_marker.write_text(tree + "\n")
        self._pending_marker.unlink(missing_ok=True)

    def settle(self) -> None:
        """Wait for the checkpoint push in flight (the task stops here); a failure is only logged."""
        try:
            self.pushes.wait()
        except GitError as exc:
            log.warning("last checkpoint not pushed", error=str(exc)[:300])

    @property
    def shared_paths(self) -> tuple[Path, ...]:
        """What the sandbox must see, read-only, for git to work in the checkout: the mirror its objects are in."""
        return (self.cache.mirror_path(self.remote),) if self.cache is not None else ()

    def release(self) -> None:
        """The task is over: its tree becomes a warm copy for the next task (or is deleted without a cache)."""
        self.settle()
        if self.cache is not None:
            self.cache.give_back(self.remote, self.path)
            try:
                self.cache.maybe_evict(time.time())
            except OSError as exc:  # the task is over and done: a cache that cannot be tidied only grows
                log.warning("warm copies not evicted", error=str(exc)[:300])
        else:
            shutil.rmtree(self.path, ignore_errors=True)

    def head(self) -> str:
        """The commit the task branch points at."""
        return self.tree.exact or self.git("rev-parse", "HEAD").strip()


def run_git(
    args: tuple[str, ...], *, cwd: Path, extra_env: Mapping[str, str] | None = None, check: bool = True
) -> str:
    """Run git with a fixed author and no terminal prompts; raise :class:`GitError` on failure."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR") if k in os.environ}
    env.update(AUTHOR)
    env["GIT_TERMINAL_PROMPT"] = "0"
    env.update(extra_env or {})
    proc = subprocess.run(["git", *SAFE_GIT, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise GitError(f"git {args[0]} failed: {last[0]}")
    return proc.stdout
