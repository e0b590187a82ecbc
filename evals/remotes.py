"""Local bare remotes for eval tasks (issue 39): each holds ONLY the history up to the row's base commit.

The commits after the base hold the gold patch (and the test patch), so a task's remote must not reach them: a
row's base repository is made by fetching the base commit alone (``git fetch SOURCE <sha>`` — the upload-pack sends
only what that commit reaches) into an empty bare repository, with one branch, ``main``, at the base, no tags and no
other refs. Each (profile, attempt) then gets a local clone of it (hard-linked objects: cheap), which the task clones
and pushes its branch to. An eval never pushes to or comments on a real forge.

The source of a row's repository (``owner/name``) is a clone or mirror in ``--repos DIR`` (``DIR/owner/name``,
``DIR/owner__name`` or ``DIR/name``, with or without ``.git``), else a bare clone from its forge kept under the evals
directory for the next run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from evals.rundir import EvalError

GIT_TIMEOUT_S = 3600
FORGE_URL = "https://github.com/{repo}.git"
_GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}


def git(*args: str, cwd: Path | None = None) -> str:
    """Run git; :class:`EvalError` with its last line of stderr when it fails."""
    env = {**os.environ, **_GIT_ENV}
    try:
        done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EvalError(f"git {args[0]}: {exc}") from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise EvalError(f"git {' '.join(args[:2])}: {why}")
    return done.stdout


def find_source(repo: str, repos_dir: Path | None) -> Path | None:
    """A local clone or mirror of ``owner/name`` in ``repos_dir``, or None."""
    if repos_dir is None:
        return None
    owner, _, name = repo.rpartition("/")
    for candidate in (f"{owner}/{name}", f"{owner}__{name}", name):
        for path in (repos_dir / candidate, repos_dir / f"{candidate}.git"):
            if (path / ".git").exists() or (path / "HEAD").is_file():
                return path
    return None


def source_for(repo: str, repos_dir: Path | None, cache_dir: Path) -> Path:
    """Where a row's base commit is fetched from: ``--repos``'s clone, else a bare clone from the forge (made once,
    under ``cache_dir``)."""
    local = find_source(repo, repos_dir)
    if local is not None:
        return local
    if repos_dir is not None:  # asked for local clones: a missing one is a mistake to name, not a download to start
        raise EvalError(f"no clone of {repo} in {repos_dir} (looked for owner/name, owner__name and name)")
    if repo.count("/") != 1:
        raise EvalError(f"repository {repo!r} is not owner/name")
    mirror = cache_dir / (repo.replace("/", "__") + ".git")
    if not (mirror / "HEAD").is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial = mirror.with_name(mirror.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        git("clone", "--bare", "--quiet", FORGE_URL.format(repo=repo), str(partial))
        partial.rename(mirror)
    return mirror


def base_repository(source: Path, base_commit: str, path: Path) -> Path:
    """A bare repository at ``path`` holding only ``base_commit``'s history, ``main`` at it (made once per row)."""
    if (path / "refs" / "heads" / "main").is_file():
        return path
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    git("init", "--bare", "--quiet", str(partial))
    try:
        git("fetch", "--quiet", "--no-tags", "--no-write-fetch-head", str(source.absolute()), base_commit,
            cwd=partial)
    except EvalError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise EvalError(f"base commit {base_commit} not fetched from {source}: {exc}") from None
    git("update-ref", "refs/heads/main", base_commit, cwd=partial)
    git("symbolic-ref", "HEAD", "refs/heads/main", cwd=partial)
    partial.rename(path)
    return path


def task_remote(base: Path, path: Path) -> Path:
    """A fresh bare remote for one task: a local clone of the row's base repository (again only ``main``)."""
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    git("clone", "--bare", "--quiet", "--no-tags", str(base.absolute()), str(path))
    git("remote", "remove", "origin", cwd=path)
    return path


def changed_lines(remote: Path, base: str, branch: str | None) -> int:
    """Lines added and removed by the task's branch against ``base`` (0 when it pushed nothing)."""
    if not branch or not remote.is_dir():
        return 0
    try:
        numstat = git("diff", "--numstat", base, f"refs/heads/{branch}", "--", cwd=remote)
    except EvalError:
        return 0
    return sum(int(n) for line in numstat.splitlines() for n in line.split("\t")[:2] if n.isdigit())


def model_patch(remote: Path, base_commit: str, branch: str | None) -> str:
    """What the task changed: ``git diff base..branch`` in its bare remote ("" when it pushed nothing)."""
    if not branch or not remote.is_dir():
        return ""
    try:
        return git("diff", "--binary", base_commit, f"refs/heads/{branch}", "--", cwd=remote)
    except EvalError:
        return ""
