"""The task's git checkout: clone, task branch, checkpoints after steps, the final commit and push.

Checkpoints make resume work on another machine: after every step that changed files, the work is
committed on the task branch and pushed to the remote, so a worker that picks the baton up clones
the branch and finds the files exactly as the last step on disk left them.

Fenced pushes (SPEC §12 "Fenced at the edges too"): every push is ``--force-with-lease`` on the checkpoint
branch, against the commit this holder itself put there last. A task's first holder puts one there at once
(step 0); each later holder *claims* the branch before it works — a new commit, so the value every earlier
holder expects is gone — and the final push moves the task branch and deletes the checkpoint branch in one
``--atomic`` push under both leases. A holder that was paused or cut off past its takeover can therefore push
nothing: its lease names a commit the remote no longer has, and the remote refuses.

Every push runs inside the holder's fence (``Context.holding``). In fleet mode (SPEC §12) that holds the task's
lease row in PostgreSQL under the holder's epoch until the push is over, and records the commit it puts on the
checkpoint branch under that epoch in the same transaction: a fenced holder's push never starts, a takeover waits
for a push in flight, and each push is leased on the commit recorded last, which every host's holder reads.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from agent import fencing
from agent.fencing import UNFENCED, Fence
from sandbox import confine, layers
from sandbox.confine import SandboxUser
from sandbox.setup import worker_git_dir
from worker.gitdirs import (
    AUTHOR,
    SAFE_GIT,
    GitError,
    agent_index_paths,
    mirror_heads,
    new_worker_git_dir,
    run_git,
    show_agent,
    take_agent_head,
    tree_env,
    write_beneath,
    write_repository,
)
from worker.leftout import (
    LeftOut,
    NeverCommitted,
    add_lines,
    ancestors,
    anchored,
    group_excluded,
    over_limit,
    zsplit,
)
from worker.pushes import BackgroundPush
from worker.warm_environment import recalled

if TYPE_CHECKING:
    from worker.workcopy import GitCache

__all__ = ["AUTHOR", "SAFE_GIT", "Checkout", "GitError", "run_git"]  # run_git and GitError: their old home

log = structlog.get_logger(__name__)


CHECKPOINT_SUBJECT = "tasuki: checkpoint after step "
RESTORED_STEP_FILE = "tasuki-restored-step"
ASIDE_PREFIX = ".aside-"  # a checkout set aside on a takeover (in {workspaces_dir}; deleted at once)
DISCARDED_PREFIX = ".discarded-"  # paths taken out of a checkout, being deleted in the background ({workspaces_dir})
HOME_SUFFIX = ".home"  # {workspaces_dir}/{uuid}.home: the task's home, beside its checkout
CLAIM_TRIES = 3


@dataclass
class TreeState:
    """What the worker knows without asking git: ``exact`` is the commit HEAD is at since the switch (None once
    unknown)."""

    exact: str | None = None
    base: str | None = None  # the commit the task's work starts from, when this attempt's prepare knows it
    shown: str | None = None  # the agent's HEAD as the worker last showed or took it (None: not known)


@dataclass
class Lease:
    """What this holder expects the remote's branches to be: the commit it put on the checkpoint branch last
    (``""``: none), and the task branch as it found it (``""``: absent). Pushes are leased on these."""

    checkpoint: str = ""
    branch: str | None = None  # None: not looked at yet
    latest: str = ""  # the newest checkpoint commit made, pushed or on its way (state.json records it)
    # In every checkpoint commit's message: git commits are content-addressed, and a claim of the same tree on the
    # same parent in the same second as an earlier holder's commit would otherwise be that very commit.
    holder: str = field(default_factory=lambda: secrets.token_hex(8))

    def message(self, subject: str) -> str:
        """A checkpoint commit's message: ``subject`` (what a resume reads) and this holder's mark."""
        return f"{subject}\n\nholder {self.holder}"


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
    fence: Fence = field(default=UNFENCED, compare=False, repr=False)  # held through every push
    lease: Lease = field(default_factory=Lease, compare=False, repr=False)
    never: NeverCommitted = field(default_factory=NeverCommitted, compare=False, repr=False)

    def git(self, *args: str, cwd: Path | None = None, check: bool = True, index: bool = False,
            stdin: str | None = None) -> str:
        """Run ``git args`` on the checkout with the worker's own git directory (never the checkout's ``.git``,
        which is the agent's: gitdirs.py); return stdout. ``index``: with the index checkpoints are staged in (else
        the one the agent is shown)."""
        env = {**(self.git_env or {}), **tree_env(self.git_dir, self.path)}
        if index:
            env["GIT_INDEX_FILE"] = str(self.index_file)
        return run_git(args, cwd=cwd or self.path, extra_env=env, check=check, stdin=stdin)

    @property
    def git_dir(self) -> Path:
        """The worker's git directory of this checkout (``{workspaces_dir}/{uuid}.git``): made anew for every task,
        out of every sandbox's reach; its config, refs, markers and excludes are the worker's alone."""
        return worker_git_dir(self.path)

    @property
    def index_file(self) -> Path:
        """The worker's index of the tree, kept across checkpoints (and, with a cache, across tasks): only
        files whose stat information changed are hashed again."""
        if self.cache is not None:
            return self.cache.index_path(self.path)
        return self.git_dir / "tasuki-checkpoint-index"

    @property
    def mirror(self) -> Path:
        """The bare repository the checkout's objects come from: the host's mirror of the remote, or (without a cache)
        a clone of the task's own in its git directory."""
        return self.cache.mirror_path(self.remote) if self.cache is not None else self.git_dir / "origin"

    @property
    def checkpoint_branch(self) -> str:
        """Where step checkpoints are pushed: beside the task branch, never on it (a follow-up's carry its
        own task's id: several tasks work on one pull request's branch, one after another)."""
        own = f"-{self.path.name[:8]}" if self.continues else ""
        return f"tasuki-checkpoints/{self.branch.removeprefix('tasuki/')}{own}"

    @property
    def home(self) -> Path:
        """The task's home (``{workspaces_dir}/{uuid}.home``): bound at the sandbox's HOME in every command of the
        task, made with the checkout and deleted when it is released."""
        return self.path.with_name(f"{self.path.name}{HOME_SUFFIX}")

    def prepare(self, *, fresh: bool = False, steps: int = 0) -> bool:
        """Make the checkout (and the task's home) exist on the task branch; return True when it was resumed.

        ``fresh``: the task has never run before, so no earlier attempt can have pushed anything. ``steps``: the
        steps the context holds (a resume that finds only the final branch claims the checkpoints with it). A home
        an earlier attempt on this host left is kept.
        """
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.home.mkdir(mode=0o700, exist_ok=True)
        os.utime(self.home)  # its last use, for the sweep of homes whose task is long gone
        if self._own_tree():  # this task's own tree (a resume on this host): its last checkpoint goes out first
            add_lines(self._exclude_file, self.never.patterns)
            pending = self._pending_marker.read_text().strip() if self._pending_marker.exists() else None
            if not fencing.ENFORCED:
                if pending:  # in the background, like any checkpoint's push
                    tree = self.git("rev-parse", f"{pending}^{{tree}}").strip()
                    self.pushes.start(lambda: self._push_checkpoint(pending, tree))
                return True
            marker = self._commit_marker
            self.claim(pending or (marker.read_text().strip() if marker.exists() else None), 0)
            return True
        heads = self._fetch()
        add_lines(self._exclude_file, self.never.patterns)  # before any file of the task can be staged
        self.lease.branch = heads.get(self.branch, "")  # a follow-up's: its pull request's head as found
        if fresh:
            self._switch(self._start_point())
            self.tree.exact = heads.get(self._start_point().removeprefix("origin/"))
            self.tree.base = self.head()
            if fencing.ENFORCED:  # the first checkpoint, at once: a takeover has a commit of ours to move
                self.pushes.start(lambda: self._push_claim(None, 0, ""))
            return False
        if self.checkpoint_branch not in heads:
            if self.branch not in heads:
                self._switch(self._start_point())
                self.tree.base = self.head()
                self._restored_from(0)  # a resume that finds nothing pushed: every step's changes are gone
                self.claim(None, 0)
                return False
            # An earlier attempt pushed its final branch (and dropped its checkpoints) but died before its
            # context was completed: the branch holds the work, so continue from it.
            self._switch(f"origin/{self.branch}")  # all of the work: the end waited for every push
            self.claim(None, steps)
            return True
        self._switch(self._start_point())
        self.tree.base = self.head()
        # An earlier attempt pushed checkpoints: put its files back as uncommitted changes, exactly as the
        # last step on disk left them (deleted files included), so `git diff` shows the work as before.
        checkpoint = f"origin/{self.checkpoint_branch}"
        self.git("read-tree", "-u", "--reset", checkpoint, index=True)
        self._show_agent_head()  # the files are the checkpoint's, HEAD and the agent's index the start's
        self._pushed_marker.write_text(self.git("rev-parse", f"{checkpoint}^{{tree}}"))
        step = self.git("log", "-1", "--format=%s", checkpoint).strip().removeprefix(CHECKPOINT_SUBJECT)
        self._restored_from(int(step) if step.isdigit() else 0)
        self.claim(heads[self.checkpoint_branch], 0)
        return True

    @property
    def _checkpoint_ref(self) -> str:
        return f"refs/heads/{self.checkpoint_branch}"

    @property
    def _branch_ref(self) -> str:
        return f"refs/heads/{self.branch}"

    def claim(self, source: str | None, step: int) -> None:
        """Take the checkpoint branch over for this holder before it works: a new commit with ``source``'s tree and
        subject (else HEAD's tree as after ``step``), pushed over whatever the remote holds now. Every earlier
        holder's lease names a commit that is no longer there, so none of its pushes can land any more."""
        if not fencing.ENFORCED:
            return
        for _ in range(CLAIM_TRIES):
            seen = self.remote_heads()
            if not self.continues or self.lease.branch is None:  # the task's own branch: only its holders push it
                self.lease.branch = seen.get(self._branch_ref, "")
            try:
                self._push_claim(source, step, seen.get(self._checkpoint_ref, ""))
                return
            except GitError as exc:  # a fenced holder's push landed between our look and our push: look again
                log.warning("checkpoint branch moved while claiming it; claiming again", error=str(exc)[:300])
        raise GitError(f"could not claim {self.checkpoint_branch}: it kept moving")

    def _push_claim(self, source: str | None, step: int, expected: str) -> None:
        """Push a claim commit onto the checkpoint branch, leased on ``expected`` (``""``: absent), the remote's
        value whatever it is: a claim takes the branch over. It becomes the commit recorded under this epoch."""
        tree = self.git("rev-parse", f"{source or 'HEAD'}^{{tree}}").strip()
        subject = self.git("log", "-1", "--format=%s", source).strip() if source else f"{CHECKPOINT_SUBJECT}{step}"
        commit = self.git("commit-tree", tree, "-p", "HEAD", "-m", self.lease.message(subject)).strip()
        ref = self._checkpoint_ref
        with self.fence.holding(commit) as recorded:
            if recorded is not None and recorded != expected:  # its holder's session ended mid-push (fleet/durable.py)
                log.warning("checkpoint branch holds a commit no lease recorded; claimed over it", found=expected,
                            recorded=recorded)
            self.git("push", "-q", f"--force-with-lease={ref}:{expected}", "origin", f"{commit}:{ref}")
        self._pushed(commit, tree)

    def _leased(self, recorded: str | None) -> str:
        """What a push expects on the checkpoint branch: the commit recorded under the lease epoch (fleet mode), else
        the one this holder put there last."""
        return self.lease.checkpoint if recorded is None else recorded

    def remote_heads(self) -> dict[str, str]:
        """The remote's task branch and checkpoint branch now (ref -> commit; an absent one is left out)."""
        listed = self.git("ls-remote", "origin", self._branch_ref, self._checkpoint_ref)
        return {ref: sha for sha, ref in (line.split("\t", 1) for line in listed.splitlines() if "\t" in line)}

    def hand_over(self, user: SandboxUser | None) -> None:
        """Give the checkout and the task's home, whole, to the sandbox's user (a root worker's sandbox runs as it):
        before the task's first sandboxed command, and again once its environment is in place."""
        confine.hand_over(self.path, user)
        confine.hand_over(self.home, user)

    def set_aside(self) -> None:
        """A takeover: move the previous holder's checkout out of the way before anything uses its path (one
        atomic rename in the same directory), then delete it. A holder paused in the middle of a tool run writes
        on, after its pause, into a directory nobody reads, and then into nothing."""
        home_aside = self.path.with_name(f"{ASIDE_PREFIX}{self.home.name}-{os.urandom(4).hex()}")
        layers.drop(self.home)  # its layers beside the home: the environment is restored or built again
        with contextlib.suppress(FileNotFoundError):  # its home too
            os.rename(self.home, home_aside)
            layers.remove_home(home_aside)
        git_aside = self.path.with_name(f"{ASIDE_PREFIX}{self.git_dir.name}-{os.urandom(4).hex()}")
        with contextlib.suppress(FileNotFoundError):  # its git directory: its markers are its lease's
            os.rename(self.git_dir, git_aside)
            shutil.rmtree(git_aside, ignore_errors=True)
        aside = self.path.with_name(f"{ASIDE_PREFIX}{self.path.name}-{os.urandom(4).hex()}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # the previous holder worked on another host
        log.warning("previous holder's checkout set aside", path=str(self.path))
        shutil.rmtree(aside, ignore_errors=True)
        if self.cache is not None:  # its index and environment record too: the next holder starts its own
            self.cache.drop_records(self.path)

    def _restored_from(self, step: int) -> None:
        (self.git_dir / RESTORED_STEP_FILE).write_text(f"{step}\n")

    def _own_tree(self) -> bool:
        """Whether the checkout is this task's own, left on this host by an earlier attempt: its git directory is
        there with the task branch checked out (a crash before the switch leaves HEAD unborn)."""
        if not (self.path.is_dir() and self.git_dir.is_dir()):
            return False
        head = self.git("symbolic-ref", "-q", "HEAD", check=False).strip()
        return head == self._branch_ref and bool(self.git("rev-parse", "-q", "--verify", "HEAD", check=False).strip())

    def _fetch(self) -> dict[str, str]:
        """Have the remote's branches as ``origin/*`` (returned: name -> commit) in a new git directory of the
        worker's: a clone of its own, or (with a cache) a freshly fetched mirror, with a warm copy as the tree; a
        copy git cannot use is discarded and made again."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.cache is None:
            shutil.rmtree(self.path, ignore_errors=True)
            shutil.rmtree(self.git_dir, ignore_errors=True)
            self.git_dir.mkdir(mode=0o700)
            run_git(("clone", "-q", "--bare", "--no-hardlinks", self.remote, str(self.mirror)), cwd=self.git_dir,
                    extra_env=self.git_env)
            heads = mirror_heads(self.mirror)
            write_repository(self.git_dir, self.remote, self.mirror, heads, {})
            self.path.mkdir(mode=0o700)
            return heads
        mirror, heads = self.cache.refresh(self.remote, self.git_env)
        if not self.path.exists():
            self.cache.take(self.remote, self.path)
        if (self.path.exists() and not self.path.is_dir()) or self.path.is_symlink():
            log.warning("working copy discarded; making a new one", error="not a directory")
            self.cache.discard(self.path)
        self.path.mkdir(mode=0o700, exist_ok=True)
        self.cache.index_path(self.path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        new_worker_git_dir(self.git_dir, self.remote, mirror, heads)
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
        self.git("clean", "-q", "-ffdx", *self._warm_environment(), index=True)  # never the top .git: git's rule
        # The agent's own git (status, diff) gets the same stat information: nothing to re-hash for it either.
        shutil.copyfile(self.index_file, self.git_dir / "index")
        self._show_agent()

    def _show_agent(self) -> None:
        """The checkout's ``.git`` (the agent's) made anew from the worker's state (gitdirs.show_agent)."""
        show_agent(self.path, self.git_dir, self.remote, self.mirror)
        self.tree.shown = self.head()

    def _show_agent_head(self) -> None:
        """The worker's index of the tree, reset to HEAD (stat information kept), becomes the agent's: its git shows
        the tree's changes against HEAD, as ``git reset`` leaves them."""
        shutil.copyfile(self.index_file, self.git_dir / "index")
        self.git("reset", "-q")
        self._show_agent()

    def _warm_environment(self) -> list[str]:
        """git clean's exclusions for the environment the previous task left in this warm copy, if the worker
        recorded one: the task's environment step reuses it when unchanged, else deletes it."""
        if self.cache is None:
            return []
        warm = recalled(self.cache.environment_path(self.path))
        return [f"--exclude={anchored(path)}" for path in warm.paths] if warm is not None else []

    @property
    def environment_record(self) -> Path | None:
        """Where the worker records the environment this warm copy holds for the next task (None: no warm copies)."""
        return self.cache.environment_path(self.path) if self.cache is not None else None

    def clean(self, paths: Sequence[str]) -> Path | None:
        """Take the untracked and ignored files under ``paths`` (relative, taken literally) out of the checkout.

        When nothing under them is tracked and none passes through a symlink, each is one rename into a directory
        beside the checkout, returned for the caller to delete once the task is over (thousands of a virtualenv's
        files cost seconds to delete on a busy disk, none of them the task's; a worker killed before leaves it to
        the hourly eviction); else git's clean deletes them here, leaving tracked files, and None is returned."""
        if not paths:
            return None
        literal = [f":(literal){path}" for path in paths]
        if self.git("ls-files", "-z", "--", *literal, index=True) or any(map(self._through_symlink, paths)):
            self.git("clean", "-q", "-ffdx", "--", *literal, index=True)
            return None
        discarded = self.path.with_name(f"{DISCARDED_PREFIX}{self.path.name}-{secrets.token_hex(4)}")
        discarded.mkdir(mode=0o700)
        for number, path in enumerate(paths):
            with contextlib.suppress(FileNotFoundError):
                os.rename(self.path / path.rstrip("/"), discarded / str(number))
        return discarded

    def _through_symlink(self, path: str) -> bool:
        parts = path.rstrip("/").split("/")
        return any((self.path.joinpath(*parts[:depth])).is_symlink() for depth in range(1, len(parts)))

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
        self.git("read-tree", "-u", "--reset", tree, index=True)
        self.git("clean", "-q", "-fd", index=True)
        self._show_agent_head()  # the agent's .git too: whatever it made of it since is gone

    def restored_step(self) -> int | None:
        """The step whose checkpoint this attempt's tree was rebuilt from (0: none was on the remote); None when
        the tree is this task's own, left on this host, so no step's changes can be missing from it."""
        marker = self.git_dir / RESTORED_STEP_FILE
        return int(marker.read_text()) if marker.exists() else None

    def restore_told(self) -> None:
        """The model has been told what :meth:`restored_step` means for it: no later attempt tells it again."""
        (self.git_dir / RESTORED_STEP_FILE).unlink(missing_ok=True)

    @property
    def _pushed_marker(self) -> Path:
        """Holds the tree of the last checkpoint on the remote; absent while none was pushed."""
        return self.git_dir / "tasuki-checkpoint-tree"

    @property
    def _commit_marker(self) -> Path:
        """Holds the commit this holder put on the checkpoint branch last (the lease of its next push)."""
        return self.git_dir / "tasuki-checkpoint-commit"

    @property
    def _pending_marker(self) -> Path:
        """Holds the checkpoint commit being pushed; absent once it is on the remote."""
        return self.git_dir / "tasuki-checkpoint-pending"

    @property
    def _exclude_file(self) -> Path:
        return self.git_dir / "info" / "exclude"

    def exclude(self, paths: Sequence[str]) -> None:
        """Never commit nor push ``paths`` (relative to the checkout; a directory ends in ``/``): each is added to
        the worker's ``info/exclude`` as an anchored pattern, once, and the agent's ``.git/info/exclude`` shows the
        same list. A path the repository tracks is still committed when it changes (git's rule)."""
        added = add_lines(self._exclude_file, [anchored(path) for path in paths if path.strip(" ./")])
        if added:
            log.info("paths excluded from the commit", count=len(added))
            write_beneath(self.path, (".git", "info", "exclude"), self._exclude_file.read_bytes())

    def _stage(self, *, index: bool) -> set[str]:
        """``git add -A``, but a file over the size limit is neither hashed nor staged, and a version of it the
        index held before is taken out again (a tracked file keeps its committed version); returns those files."""
        changed = self.git("ls-files", "-z", "--others", "--modified", "--exclude-standard", index=index)
        big = set(over_limit(self.path, zsplit(changed), self.never.max_file_bytes))
        self.git("add", "-A", "--", ".", *(f":(top,literal,exclude){name}" for name in sorted(big)), index=index)
        if not index:  # the agent's own index: it may have staged a large file itself
            staged = self.git("diff-index", "--cached", "-z", "--name-only", "--diff-filter=AMT", "HEAD")
            big |= set(over_limit(self.path, zsplit(staged), self.never.max_file_bytes))
        if big:
            self.git("reset", "-q", "HEAD", "--", *(f":(top,literal){name}" for name in sorted(big)), index=index)
            log.info("files over the size limit left out", files=sorted(big)[:20], limit=self.never.max_file_bytes)
        return big

    def commit(self, message: str) -> bool:
        """Commit everything but what is never committed (if anything changed) on top of the agent's own commits, with
        what it staged or unstaged itself; return whether a commit was made."""
        self._take_agent_work()
        self._stage(index=False)
        if not self.git("diff-index", "--cached", "--name-only", "HEAD").strip():
            return False
        self.git("commit", "-q", "--no-verify", "-m", message)
        self.tree.exact = None
        return True

    def _take_agent_work(self) -> None:
        """The agent's HEAD becomes the task branch's, and the agent's index's paths the worker's (its ``git rm
        --cached``, its ``git add -f``), both read in a jail (gitdirs.py); the files are the tree's, as always."""
        head = take_agent_head(self.git_dir, self.path, self.shared_paths)
        if head is None:
            return
        # Only commits the agent made since its .git was shown (or since they were last taken) move the branch: the
        # worker's own commits since then are not the agent's HEAD's, and must not be undone by it.
        if head not in (self.head(), self.tree.shown):
            self.git("reset", "-q", head)  # the branch moves with it; the index keeps what it knew of the files
            self.tree.exact = None
        self.tree.shown = head
        paths = agent_index_paths(self.path, self.shared_paths)
        if paths is None:
            return
        ours = set(zsplit(self.git("ls-files", "-z")))
        if dropped := sorted(ours - paths):
            self.git("rm", "-q", "--cached", "--ignore-unmatch", "--pathspec-from-file=-", "--pathspec-file-nul",
                     stdin="\0".join(f":(top,literal){name}" for name in dropped))
        if added := sorted(name for name in paths - ours if os.path.lexists(self.path / name)):
            self.git("add", "-f", "--pathspec-from-file=-", "--pathspec-file-nul", check=False,
                     stdin="\0".join(f":(top,literal){name}" for name in added))

    def left_out(self) -> LeftOut:
        """What the tree holds that the last commit left out: paths only the never-committed patterns (and a setup's
        paths) ignore, grouped by directory, and files over the size limit. The repository's own ``.gitignore``
        is its business: what it ignores is not named."""
        limit = self.never.max_file_bytes
        plain = set(zsplit(self.git("ls-files", "-z", "--others", "--exclude-per-directory=.gitignore")))
        kept = zsplit(self.git("ls-files", "-z", "--others", "--modified", "--exclude-standard"))
        excluded = plain.difference(kept)
        dirs = sorted({d for name in excluded for d in ancestors(name)})
        ignored: set[str] = set()
        if dirs:  # each left-out file is named by the outermost ignored directory it is in
            ignored.update(zsplit(self.git("check-ignore", "-z", "--stdin", check=False, stdin="\0".join(dirs))))
        return LeftOut(group_excluded(excluded, ignored), over_limit(self.path, kept, limit), limit)

    def changed_since(self, base: str | None) -> bool:
        """Whether the task branch's tree differs from ``base``'s (the commit the task started from); an unknown
        base counts as changed."""
        if not base:
            return True
        if base == self.tree.exact:  # HEAD is still the start commit, known without asking git
            return False
        try:
            base_tree = self.git("rev-parse", "--verify", "-q", f"{base}^{{tree}}").strip()
        except GitError:  # not in this clone (a force-pushed pull request): assume the work is there
            return True
        return self.git("rev-parse", "HEAD^{tree}").strip() != base_tree

    def work_changed_since(self, base: str | None) -> bool:
        """Whether the files as they are now — what a commit would take, never-committed paths left out — differ from
        ``base``'s tree, without committing (an ending that delivers nothing asks; an unknown base counts as
        changed). Staged in the checkpoints' index: HEAD and the agent's index are left alone."""
        if not base:
            return True
        try:
            base_tree = self.git("rev-parse", "--verify", "-q", f"{base}^{{tree}}").strip()
        except GitError:
            return True
        return self.work_tree() != base_tree

    def work_tree(self) -> str:
        """The tree a commit of the files as they are now would have (never-committed paths left out), staged in the
        checkpoints' index by the worker's git: HEAD, the agent's index and its ignore files are not trusted for it."""
        if not self.index_file.exists():
            self.git("read-tree", "HEAD", index=True)
        self._stage(index=True)
        return self.git("write-tree", index=True).strip()

    def drop_checkpoints(self) -> None:
        """The task changed nothing: no branch is pushed, and the checkpoint branch its holders pushed goes, leased
        on this holder's last checkpoint (a fenced holder's delete is refused like its pushes)."""
        self.pushes.wait()
        if not fencing.ENFORCED:
            if self._pushed_marker.exists():
                self.git("push", "-q", "origin", "--delete", self.checkpoint_branch, check=False)
            return
        with self.fence.holding("") as recorded:
            expected = self._leased(recorded)
            if expected:
                ref = self._checkpoint_ref
                self.git("push", "-q", f"--force-with-lease={ref}:{expected}", "origin", f":{ref}")
        self.lease.checkpoint = ""

    def push(self) -> None:
        """Push the task branch to the remote and drop the checkpoints it supersedes: one atomic push, leased
        on both branches (a follow-up's branch is a pull request's: nobody's commits are forced over either)."""
        self.pushes.wait()  # a checkpoint pushed after the deletion below would come back
        if not fencing.ENFORCED:
            force = () if self.continues else ("--force",)
            self.git("push", "-q", *force, "origin", f"HEAD:refs/heads/{self.branch}")
            if self._pushed_marker.exists():
                self.git("push", "-q", "origin", "--delete", self.checkpoint_branch, check=False)
            return
        with self.fence.holding("") as recorded:  # the checkpoint branch goes with this push
            leases = [f"--force-with-lease={self._branch_ref}:{self.lease.branch or ''}"]
            refs = [f"HEAD:{self._branch_ref}"]
            expected = self._leased(recorded)
            if expected:
                leases.append(f"--force-with-lease={self._checkpoint_ref}:{expected}")
                refs.append(f":{self._checkpoint_ref}")
            self.git("push", "-q", "--atomic", *leases, "origin", *refs)
        # The branch is this holder's push now: a later push of the same checkout (a budget stop's, the App
        # benchmark's) leases on it, not on the branch as it was first found.
        self.lease.branch = self.git("rev-parse", "HEAD").strip()
        self.lease.checkpoint = ""

    def checkpoint(self, step: int) -> bool:
        """Snapshot the working tree (without touching HEAD or the agent's index) and push it beside the task
        branch in the background, so another worker can resume from it; returns whether there was a new one."""
        if not self.index_file.exists():
            self.git("read-tree", "HEAD", index=True)
        self._stage(index=True)
        tree = self.git("write-tree", index=True).strip()
        self.pushes.wait()
        marker = self._pushed_marker
        previous = marker.read_text().strip() if marker.exists() else self.git("rev-parse", "HEAD^{tree}").strip()
        if tree == previous:
            return False
        commit = self.git("commit-tree", tree, "-p", "HEAD", "-m", self.lease.message(f"{CHECKPOINT_SUBJECT}{step}"))
        commit = commit.strip()
        self._pending_marker.write_text(commit + "\n")  # a resume on this host pushes it, if this process cannot
        self.lease.latest = commit
        self.pushes.start(lambda: self._push_checkpoint(commit, tree))
        return True

    def _push_checkpoint(self, commit: str, tree: str) -> None:
        ref = self._checkpoint_ref
        if not fencing.ENFORCED:
            self.git("push", "-q", "--force", "origin", f"{commit}:{ref}")
            self._pushed(commit, tree)
            return
        with self.fence.holding(commit) as recorded:
            try:
                lease = f"--force-with-lease={ref}:{self._leased(recorded)}"
                self.git("push", "-q", lease, "origin", f"{commit}:{ref}")
            except GitError:
                if self.remote_heads().get(ref) != commit:  # not a retry of a push that had landed after all
                    raise
        self._pushed(commit, tree)

    def _pushed(self, commit: str, tree: str) -> None:
        """``commit`` (of ``tree``) is on the checkpoint branch, put there by this holder."""
        self.lease.checkpoint = commit
        self.lease.latest = self.lease.latest or commit
        self._commit_marker.write_text(commit + "\n")
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
        return (self.mirror,)

    def release(self) -> None:
        """The task is over: its tree becomes a warm copy for the next task (or is deleted without a cache); its
        home is deleted."""
        self.settle()
        layers.remove_home(self.home)
        shutil.rmtree(self.git_dir, ignore_errors=True)
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

