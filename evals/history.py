"""A repository's merged changes, as ``tasuki eval mine`` reads them (issue 39): the first-parent history of the
default branch (merge commits and plain commits alike), each change's diff split into its test part and its code
part.

A change is a candidate when it touches both tests and code: the code part is the task (the gold patch), the test
part is held back for grading. What counts as a test file is :func:`is_test_path`; code is a non-test file with a
source extension (a change to the changelog and the tests alone is no task). Every non-test file goes in the patch,
as in SWE-bench (a fix's docs and changelog are part of it).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from contexts.errors import TasukiError

GIT_TIMEOUT_S = 120
MAX_MERGED = 20  # commit messages a merge's statement falls back on
# git on a repository the miner did not make: no hooks, no fsmonitor, no ownership check (a mirror may be another
# user's), and no replace refs rewriting history under the rows.
_GIT = ("git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "safe.directory=*")
_GIT_ENV = {"GIT_NO_REPLACE_OBJECTS": "1", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}

TEST_DIRS = frozenset({"tests", "test", "spec", "specs", "__tests__", "testing"})
_TEST_NAMES = (
    re.compile(r"^test_.*\.py$"), re.compile(r"^.*_test\.py$"), re.compile(r"^.*_test\.go$"),
    re.compile(r"^.*\.(test|spec)\.[cm]?[jt]sx?$"), re.compile(r"^.*_spec\.rb$"), re.compile(r"^.*Tests?\.java$"),
    re.compile(r"^conftest\.py$"),
)
CODE_SUFFIXES = frozenset({
    ".py", ".pyi", ".pyx", ".go", ".js", ".jsx", ".mjs", ".cjs", ".ts", ".tsx", ".rs", ".rb", ".java", ".kt",
    ".scala", ".c", ".h", ".cc", ".cpp", ".hpp", ".cs", ".php", ".swift", ".m", ".ex", ".exs", ".erl", ".clj",
    ".hs", ".ml", ".lua", ".sh", ".pl",
})


class MineError(TasukiError):
    """The repository cannot be mined: not a git repository, a revision it lacks, a git command that failed."""


class SourceUnreachable(MineError):
    """``OWNER/REPO`` could not be cloned from its forge (exit 1: what was asked for is not there)."""


def git(repo: Path, *args: str, stdin: str | None = None, check: bool = True) -> str:
    """git's standard output in ``repo`` (a bare repository or a work tree); MineError with its message."""
    try:
        done = subprocess.run([*_GIT, *args], cwd=repo, input=stdin, capture_output=True, text=True,
                              errors="surrogateescape", timeout=GIT_TIMEOUT_S, check=False,
                              env={**os.environ, **_GIT_ENV})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MineError(f"git {args[0]} failed: {exc}") from None
    if check and done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise MineError(f"git {args[0]} failed: {why}")
    return done.stdout


def is_test_path(path: str) -> bool:
    """A test file: under a tests/test/spec directory, or named like one (test_x.py, x_test.go, x.test.ts ...)."""
    parts = PurePosixPath(path).parts
    return any(part in TEST_DIRS for part in parts[:-1]) or any(p.match(parts[-1]) for p in _TEST_NAMES)


def is_code_path(path: str) -> bool:
    """A source file that is not a test (what makes a change a task)."""
    return not is_test_path(path) and PurePosixPath(path).suffix in CODE_SUFFIXES


@dataclass(frozen=True)
class Change:
    """One merged change: its commit, its first parent (the row's base), its message (a merge's followed by those of
    the commits it brought in) and its split diff."""

    commit: str
    base: str
    message: str
    date: str
    test_files: tuple[str, ...]
    code_files: tuple[str, ...]
    other_files: tuple[str, ...]

    @property
    def candidate(self) -> bool:
        """It touches tests and code both."""
        return bool(self.test_files) and bool(self.code_files)


def first_parent_changes(repo: Path, head: str = "HEAD", since: str | None = None) -> Iterator[Change]:
    """Each change of ``head``'s first-parent history, newest first (after ``since`` only, when given); the root
    commit, which has no base, is left out."""
    span = f"{since}..{head}" if since else head
    listed = git(repo, "rev-list", "--first-parent", "--parents", span)
    for line in listed.splitlines():
        commit, *parents = line.split()
        if parents:
            yield change_of(repo, commit, parents[0])


def change_of(repo: Path, commit: str, base: str) -> Change:
    """The change ``base..commit`` with its files sorted into test, code and other."""
    files = [path for path in git(repo, "diff", "--no-renames", "--name-only", "-z", base, commit).split("\0")
             if path]
    message = git(repo, "log", "-1", "--format=%B", commit).strip()
    if len(git(repo, "log", "-1", "--format=%P", commit).split()) > 1:  # a merge: what it brought in says more
        merged = git(repo, "log", "--no-merges", f"--max-count={MAX_MERGED}", "--format=%B%x00", f"{base}..{commit}")
        told = [text.strip() for text in merged.split("\0") if text.strip()]
        message = "\n\n".join([message, *told]) if told else message
    date = git(repo, "log", "-1", "--format=%cI", commit).strip()
    tests = tuple(path for path in files if is_test_path(path))
    code = tuple(path for path in files if is_code_path(path))
    other = tuple(path for path in files if path not in tests and path not in code)
    return Change(commit, base, message, date, tests, code, other)


def diff(repo: Path, base: str, commit: str, paths: Sequence[str]) -> str:
    """The unified diff of ``paths`` from ``base`` to ``commit`` (binary files too), as ``git apply`` takes it."""
    if not paths:
        return ""
    return git(repo, "diff", "--no-renames", "--binary", "--no-color", "--no-ext-diff", base, commit, "--",
               *(f":(literal){path}" for path in paths))


def default_head(repo: Path) -> str:
    """The default branch's commit (the repository's HEAD); MineError for a path that is no git repository."""
    if not repo.is_dir():
        raise MineError(f"{repo}: no such directory")
    inside = git(repo, "rev-parse", "--is-inside-work-tree", "--is-bare-repository", check=False).split()
    if "true" not in inside:
        raise MineError(f"{repo}: not a git repository")
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", "HEAD^{commit}").strip()
    except MineError:
        raise MineError(f"{repo}: the repository has no commit on its default branch") from None


def resolve(repo: Path, rev: str) -> str:
    """``rev``'s commit; MineError naming it when the repository has none such."""
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
    except MineError:
        raise MineError(f"{repo}: no commit {rev!r}") from None
