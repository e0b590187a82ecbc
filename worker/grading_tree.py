"""Where an eval task's grading runs (worker/grading.py): a fresh tree holding the commit with the test patch laid in,
and a fresh home with the environment its setup left (the snapshot of ``state.json``'s ``environment.key``), in a
private directory of the worker's, removed afterwards; and the sandboxed calls that run there.

The agent's checkout and home are read by nothing here but the worker's git directory, and written by nothing
(:func:`lay_committed` is the exception, for a tree an older version of the grading laid the patch into).
"""

from __future__ import annotations

import os
import shlex
import socket
import stat
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agent.tools.protocol import ToolOptions, ToolOutcome
from agent.tools.shell import BashTool, exit_code_of
from agent.tools.workspace import Workspace
from contexts import Context, TasukiError
from contexts.lock import process_started
from contexts.masking import mask
from sandbox import confine, layers
from sandbox.jail import Sandbox, backend, make_sandbox
from sandbox.snapshot_files import SnapshotError, copy_entries
from worker.checkout import Checkout
from worker.environment import snapshot_store
from worker.gitdirs import GitError, run_git, tree_env
from worker.settings_models import Settings

AREA_PREFIX = "tasuki-grading-"  # the grading's directory in the worker's temporary directory
OUTPUT_MAX_CHARS = 1_000_000  # of the test run's output read (head and tail: the runners' summaries are at the end)
LAY_TIMEOUT_S = 120
NO_ENVIRONMENT = "none"
_LAY_FAILED = 96


class GradingError(TasukiError):
    """Grading could not judge the work (one line, the grade's ``error``)."""


@dataclass(frozen=True)
class GradingArea:
    """The grading's private directory: ``tree`` (the graded tree, the sandbox's checkout) and ``home``."""

    path: Path

    @property
    def tree(self) -> Path:
        return self.path / "tree"

    @property
    def home(self) -> Path:
        return self.path / "home"


@contextmanager
def grading_area() -> Iterator[GradingArea]:
    """A private (0700) directory of the worker's with an empty tree and home, removed afterwards whatever the tests
    left in it (no link followed, a mode-000 directory opened first)."""
    area = GradingArea(Path(tempfile.mkdtemp(prefix=AREA_PREFIX)))
    try:
        area.tree.mkdir(mode=0o700)
        area.home.mkdir(mode=0o700)
        yield area
    finally:
        layers.remove_tree(area.path)


def remove_area(path: str | None) -> None:
    """Remove a grading's directory a killed holder left (named in ``state.json``: the worker's own words); anything
    but a directory of this host's temporary directory with the grading's prefix is left alone."""
    if not path:
        return
    area = Path(path)
    if area.parent != Path(tempfile.gettempdir()) or not area.name.startswith(AREA_PREFIX):
        return
    try:
        if stat.S_ISDIR(os.lstat(area).st_mode):
            layers.remove_tree(area)
    except FileNotFoundError:
        pass


def write_tree(checkout: Checkout, head: str, base: str, patch: str, files: Sequence[str], into: Path) -> None:
    """Write the commit ``head``'s tree beneath ``into``, with ``files`` reset to ``base`` and the patch applied, by
    the worker's own git in a scratch index beside it."""
    git = _ScratchGit(checkout, Path(tempfile.mkdtemp(prefix=AREA_PREFIX, dir=into.parent)))
    try:
        git("read-tree", head)
        at_base = git.entries(base, files)  # a file the base lacks leaves the index (mode 0)
        lines = [at_base.get(path, f"0 {'0' * 40}") + f"\t{path}" for path in files]
        git("update-index", "-z", "--index-info", stdin="\0".join(lines) + "\0")
        try:
            git("apply", "--cached", "--whitespace=nowarn", "-", stdin=patch)
        except GitError as exc:
            why = str(exc).removeprefix("git apply failed: ")
            raise GradingError(f"the test patch does not apply: {why}") from None
        git("checkout-index", "-a", "-f", f"--prefix={into}/")
    finally:
        layers.remove_tree(git.scratch)


def lay_environment(ctx: Context, settings: Settings, area: GradingArea) -> str:
    """Copy the task's environment, as its setup left it, into the area's home and tree: ``"snapshot KEY"``; or
    ``"none"`` when it has no snapshot on this host (the home stays empty). A snapshot that cannot be copied is a
    :class:`GradingError` (an honest fix graded without its environment would fail)."""
    key = str((ctx.read_state().get("environment") or {}).get("key") or "")
    if not key or not backend(settings.sandbox.backend).confines:  # no snapshot is kept without a sandbox
        return NO_ENVIRONMENT
    store = snapshot_store(settings)
    try:
        held = store.hold(key)  # the sweep keeps it while it is copied
        try:
            snapshot = store.find(key)
            if snapshot is None:
                return NO_ENVIRONMENT
            for path in snapshot.paths:  # the setup's paths are the environment's, whatever the commit put there
                _clear(area.tree, path)
            store.restore(snapshot, area.home, None)  # the home only: the key's spare stays for the next task
            if snapshot.checkout.is_dir():
                copy_entries(snapshot.checkout, area.tree)
        finally:
            os.close(held)
    except (OSError, SnapshotError) as exc:
        raise GradingError(mask(f"the environment's snapshot was not copied for the grading: {exc}")[:300]) from None
    return f"snapshot {key}"


def _clear(tree: Path, path: str) -> None:
    """Remove what the tree holds at ``path`` (relative), or at the first of its parents that is no real directory:
    nothing is followed."""
    current = tree
    parts = [part for part in path.split("/") if part]
    if any(part in (".", "..") for part in parts):  # never a snapshot's (refused when it was kept)
        return
    for depth, part in enumerate(parts):
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            return
        if depth == len(parts) - 1 or not stat.S_ISDIR(info.st_mode):
            if stat.S_ISDIR(info.st_mode):
                layers.remove_tree(current)
            else:
                os.unlink(current)
            return


class _ScratchGit:
    """The worker's git directory of the checkout with an index and an empty working tree in ``scratch``: the
    checkout, the worker's index and the agent's are left alone. No system or user config is read (git-lfs installed
    on the host defines a filter driver there, which an attribute the agent committed would name for the files laid
    out), nor a system attributes file: the files are laid out as the commits hold them."""

    def __init__(self, checkout: Checkout, scratch: Path) -> None:
        self.scratch = scratch
        self.tree = scratch / "tree"
        self.tree.mkdir(mode=0o700)
        self.env = {**tree_env(checkout.git_dir, self.tree), "GIT_INDEX_FILE": str(scratch / "index"),
                    "GIT_LITERAL_PATHSPECS": "1", "GIT_NO_REPLACE_OBJECTS": "1", "GIT_CONFIG_NOSYSTEM": "1",
                    "GIT_CONFIG_GLOBAL": os.devnull, "GIT_ATTR_NOSYSTEM": "1"}

    def __call__(self, *args: str, stdin: str | None = None) -> str:
        return run_git(args, cwd=self.tree, extra_env=self.env, stdin=stdin, timeout_s=LAY_TIMEOUT_S)

    def entries(self, commit: str, files: Sequence[str]) -> dict[str, str]:
        """``path -> "mode sha"`` of those of ``files`` that ``commit`` holds."""
        listed = self("ls-tree", "-z", commit, "--", *files)
        found = {}
        for entry in filter(None, listed.split("\0")):
            meta, _, path = entry.partition("\t")
            mode, _kind, sha = meta.split(" ")
            found[path] = f"{mode} {sha}"
        return found

    def lay(self, files: Sequence[str], into: Path) -> list[str]:
        """Write the index's versions of ``files`` beneath ``into``; those it holds (the rest are to be absent)."""
        present = [path for path in self("ls-files", "-z", "--", *files).split("\0") if path in files]
        if present:
            self("checkout-index", "-f", "-z", "--stdin", f"--prefix={into}/", stdin="\0".join(present))
        return present


class GradingShell:
    """The grading's commands: bash in the task's sandbox with no network, in ``tree`` with ``home`` (the caller hands
    what it wrote there to the sandbox's user: a root worker's sandbox runs as it); ``read_only``: more host paths it
    sees."""

    def __init__(self, ctx: Context, settings: Settings, timeout_s: int, tree: Path, home: Path,
                 read_only: Sequence[Path] = ()) -> None:
        self.ctx = ctx
        self.tree = tree
        self.home = home
        self.timeout_s = timeout_s
        offline = settings.sandbox.model_copy(update={"network": "none"})
        self.sandbox: Sandbox = make_sandbox(offline, read_only=tuple(read_only))
        self.limits = settings.sandbox.limits

    def run(self, script: str, timeout_s: int | None = None) -> ToolOutcome:
        """``script`` in the sandbox (the grading's timeout unless ``timeout_s``)."""
        options = ToolOptions(bash_timeout_s=timeout_s or self.timeout_s, max_output_chars=OUTPUT_MAX_CHARS,
                              sandbox=self.sandbox, limits=self.limits, on_start=self._started, home=self.home)
        try:
            return BashTool().run(Workspace(self.tree), {"command": script}, options)
        finally:
            self.ctx.update_state(running_command=None)

    def _started(self, pgid: int) -> None:
        """Recorded as the agent's commands are: a resumed attempt makes sure it is dead."""
        running = {"pgid": pgid, "host": socket.gethostname(), "started": process_started(pgid)}
        self.ctx.update_state(running_command=running)


def lay_committed(ctx: Context, checkout: Checkout, settings: Settings, head: str, files: Sequence[str]) -> None:
    """Lay the committed versions of ``files`` back into the checkout, which an older version of the grading laid the
    test patch into before its holder stopped: written by the worker's git into a private directory, copied in by a
    sandboxed call (the host follows no link of the agent's tree). GradingError when they could not be."""
    with grading_area() as area:
        git = _ScratchGit(checkout, Path(tempfile.mkdtemp(prefix=AREA_PREFIX, dir=area.path)))
        git("read-tree", head)
        present = set(git.lay(files, area.tree))
        shell = GradingShell(ctx, settings, LAY_TIMEOUT_S, checkout.path, checkout.home,
                             (*checkout.shared_paths, area.tree))
        confine.hand_over(area.tree, shell.sandbox.user)  # read by the sandbox's user
        steps = ["set -u"]
        for path in files:
            quoted, source = shlex.quote(path), shlex.quote(f"{area.tree}/{path}")  # bound at its own path
            steps.append(f"rm -rf -- {quoted}")
            if path in present:
                steps.append(f'mkdir -p -- "$(dirname -- {quoted})" && cp -P --preserve=mode -- {source} {quoted} '
                             f"|| exit {_LAY_FAILED}")
        outcome = shell.run("\n".join(steps))
    lines = outcome.output.splitlines()
    if outcome.error is not None or not lines or exit_code_of(lines[-1]) != 0:
        raise GradingError(mask(f"the files were not laid in: {outcome.output.strip()[-300:] or outcome.error}"))
