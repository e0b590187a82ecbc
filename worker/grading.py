"""Grading an eval task (issue 39): once the agent's work is committed, and before it is pushed, the held-back test
patch is laid over it and its tests run in the task's sandbox with no network.

The agent never sees the test patch: it is in the Celery message and the context's metadata (neither in its sandbox),
and reaches the checkout only here, after the agent's last command is over. The worker's own git (never the agent's
``.git``) computes the graded files — the committed work with the patch's files reset to the base and the patch
applied — and writes them into a private directory of its own, made for the grading and bound read-only into the
grading's sandbox, from which a sandboxed call lays them into the checkout and runs the tests; a second call lays the
committed versions back. The agent wrote its home and checkout: nothing of either steers that git (it works in a
scratch tree and index with no system or user config, so no attribute of the agent's names a filter it would run),
and the host writes into neither (a link there is never followed). So the patch is on no command line
(only the files' names and the test command are), and nothing of it can be pushed: the push takes the commit, which
was made before. ``state.json``'s ``grading`` says while the tree holds the patch, so a resume on this host lays the
committed files back before anything else reads the tree (:func:`recover`).

A grading that fails — the patch does not apply, the tests time out or report nothing — is a :class:`Grade` with its
``error`` set and ``resolved`` False, never a failed task.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from agent.tools.protocol import ToolOptions, ToolOutcome
from agent.tools.shell import BashTool, exit_code_of
from agent.tools.workspace import Workspace
from contexts import Context, TasukiError
from contexts.lock import process_started
from contexts.masking import mask
from sandbox import confine
from sandbox.jail import Sandbox, backend, make_sandbox
from sandbox.test_results import Grade, failed_grade, grade, parse_results, test_command, test_files
from worker.checkout import Checkout
from worker.gitdirs import GitError, run_git, tree_env
from worker.settings_models import Settings

log = structlog.get_logger(__name__)

TOOL_NAME = "grade"  # its record in tools.jsonl
OUTPUT_MAX_CHARS = 1_000_000  # of the test run's output read (head and tail: the runners' summaries are at the end)
TAIL_LINES = 40  # of the test run's output kept in the record
TAIL_MAX_CHARS = 4_000
LAY_TIMEOUT_S = 120
_TESTS = "@@tasuki-grade:tests"  # the grading call's output: the tests' own output follows this line
_LAY_FAILED = 96


class GradingError(TasukiError):
    """Grading could not judge the work (one line, the grade's ``error``)."""


@dataclass(frozen=True)
class Grading:
    """The request's ``grading``: the held-back test patch, the tests that must pass, how to run and read them."""

    test_patch: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...] = ()
    test_command: str | None = None
    parser: str = "pytest"
    timeout_s: int | None = None  # None: agent.check_timeout_s

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Grading:
        """Read the request's field (test lists as lists, or as the JSON-encoded strings SWE-bench ships)."""
        return cls(str(data.get("test_patch") or ""), _tests(data.get("fail_to_pass")),
                   _tests(data.get("pass_to_pass")), data.get("test_command") or None,
                   str(data.get("parser") or "pytest"), int(data["timeout_s"]) if data.get("timeout_s") else None)


def _tests(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else []
    return tuple(str(test) for test in value or ())


def grade_work(ctx: Context, checkout: Checkout, request: Mapping[str, Any], base: str,
               settings: Settings) -> dict[str, Any]:
    """Grade the committed work in the sandbox; the grade as the task's result holds it (with ``duration_s``)."""
    started = time.monotonic()
    spec = Grading.from_json(request)
    files = test_files(spec.test_patch)
    command = test_command(spec.test_command, spec.parser, files)
    head = checkout.head()
    run, restored = TestRun(), True
    with staging_area() as staging:
        shell = GradingShell(ctx, checkout, settings, spec.timeout_s or settings.agent.check_timeout_s, staging)
        try:
            check_files(files)
            ctx.update_state(grading={"status": "applying", "files": files, "head": head})
            try:
                present = stage(checkout, head, base, spec.test_patch, files, shell.fresh("graded"))
                run = shell.run_tests(files, present, command)
            finally:
                restored = restore(ctx, checkout, shell, head, files)
            graded = judge(run, spec)
        except GradingError as exc:
            graded = failed_grade(str(exc), spec.fail_to_pass, spec.pass_to_pass)
        except Exception as exc:  # never fails the task: the grade says why it could not be had
            log.exception("grading failed")
            why = mask(f"grading failed: {type(exc).__name__}: {exc}".splitlines()[0])[:500]
            graded = failed_grade(why, spec.fail_to_pass, spec.pass_to_pass)
    duration = time.monotonic() - started
    result = {**graded.to_json(), "duration_s": round(duration, 2)}
    record(ctx, graded, files, command, run, restored, duration, shell.confined)
    log.info("task graded", resolved=graded.resolved, error=graded.error, failed=graded.failed[:20],
             duration_s=round(duration, 1))
    return result


@dataclass(frozen=True)
class TestRun:
    """What the grading call gave: the tests' output (after the marker), its exit code, whether it timed out."""

    __test__ = False  # pytest: a class named Test* that is no test
    output: str = ""
    exit_code: int | None = None
    timed_out: bool = False
    ran: bool = False


def judge(run: TestRun, spec: Grading) -> Grade:
    """The grade of a test run; a run that timed out, or named no test at all, says so in ``error``."""
    results = parse_results(spec.parser, run.output)
    graded = grade(results, spec.fail_to_pass, spec.pass_to_pass)
    if run.timed_out:
        return Grade(False, graded.fail_to_pass, graded.pass_to_pass, "the tests timed out")
    if not results:
        last = next((line for line in reversed(run.output.splitlines()) if line.strip()), "no output")
        why = f"the test run reported no result (exit code {run.exit_code}): {last.strip()[:200]}"
        return Grade(False, graded.fail_to_pass, graded.pass_to_pass, mask(why))
    return graded


def check_files(files: Sequence[str]) -> None:
    """The test patch's files are paths in the tree (no ``..``, nothing absolute, nothing in a ``.git``): else a
    :class:`GradingError` before anything is laid."""
    if not files:
        raise GradingError("the test patch touches no file")
    for path in files:
        parts = path.split("/")
        if path.startswith("/") or any(part in ("", ".", "..") or part.lower() == ".git" for part in parts):
            raise GradingError(mask(f"the test patch names a path outside the tree: {path[:200]!r}"))


@contextmanager
def staging_area() -> Iterator[Path]:
    """A private directory of the worker's for the files the grading lays (in its temporary directory, which no
    sandbox shows), removed afterwards; the grading's sandbox sees it read-only at its own path."""
    staging = Path(tempfile.mkdtemp(prefix="tasuki-grading-"))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def stage(checkout: Checkout, head: str, base: str, patch: str, files: Sequence[str], into: Path) -> list[str]:
    """Write the graded versions of ``files`` (the commit ``head`` with them reset to ``base``, the patch applied)
    beneath ``into``, by the worker's own git in a scratch index; the files that exist after it."""
    with tempfile.TemporaryDirectory(prefix="tasuki-grading-") as scratch:
        git = _ScratchGit(checkout, Path(scratch))
        git("read-tree", head)
        at_base = git.entries(base, files)  # a file the base lacks leaves the index (mode 0)
        lines = [at_base.get(path, f"0 {'0' * 40}") + f"\t{path}" for path in files]
        git("update-index", "-z", "--index-info", stdin="\0".join(lines) + "\0")
        try:
            git("apply", "--cached", "--whitespace=nowarn", "-", stdin=patch)
        except GitError as exc:
            why = str(exc).removeprefix("git apply failed: ")
            raise GradingError(f"the test patch does not apply: {why}") from None
        return git.lay(files, into)


def restore(ctx: Context, checkout: Checkout, shell: GradingShell, head: str, files: Sequence[str]) -> bool:
    """Lay the committed versions of ``files`` back into the checkout; the staging directory goes. False (logged, and
    ``state.json`` still saying so) when they could not be: the tree is not the commit's."""
    try:
        with tempfile.TemporaryDirectory(prefix="tasuki-grading-") as scratch:
            git = _ScratchGit(checkout, Path(scratch))
            git("read-tree", head)
            into = shell.fresh("committed")
            present = git.lay(files, into)
        shell.lay(files, present, into)
    except Exception as exc:
        log.warning("the checkout was not restored after grading", error=mask(str(exc))[:300])
        return False
    ctx.update_state(grading={"status": "done", "files": list(files), "head": head})
    return True


def recover(ctx: Context, checkout: Checkout, settings: Settings) -> None:
    """A resumed task whose last holder stopped while the tree held the test patch: the committed files go back before
    the agent or a commit can see the tree."""
    grading = ctx.read_state().get("grading") or {}
    if grading.get("status") != "applying" or not grading.get("head"):
        return
    head, files = str(grading["head"]), [str(path) for path in grading.get("files") or ()]
    if not _has_commit(checkout, head):  # a takeover set the old tree aside: this one is the remote's (never patched)
        log.info("the last holder stopped while grading; its tree was set aside, so no test patch is left in it")
        ctx.update_state(grading={"status": "done", "files": files, "head": head})
        return
    log.warning("the last holder stopped while grading; the committed files are laid back")
    with staging_area() as staging:
        restored = restore(ctx, checkout, GradingShell(ctx, checkout, settings, LAY_TIMEOUT_S, staging), head, files)
    if not restored:
        raise GradingError("the test patch an interrupted grading laid into the tree could not be removed")


def _has_commit(checkout: Checkout, commit: str) -> bool:
    """Whether the worker's git of the checkout holds ``commit``."""
    try:
        run_git(("cat-file", "-e", f"{commit}^{{commit}}"), cwd=checkout.path,
                extra_env=tree_env(checkout.git_dir, checkout.path))
    except GitError:
        return False
    return True


class _ScratchGit:
    """The worker's git directory of the checkout with an index and an empty working tree in ``scratch``: the
    checkout, the worker's index and the agent's are left alone. No system or user config is read (git-lfs installed
    on the host defines a filter driver there, which an attribute the agent committed would name for the files laid
    out), nor a system attributes file: the files are laid out as the commits hold them."""

    def __init__(self, checkout: Checkout, scratch: Path) -> None:
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
    """The grading's commands: bash in the task's sandbox with no network, in the checkout, with the task's home, and
    the worker's ``staging`` directory (:func:`staging_area`) read-only."""

    def __init__(self, ctx: Context, checkout: Checkout, settings: Settings, timeout_s: int, staging: Path) -> None:
        self.ctx = ctx
        self.checkout = checkout
        self.timeout_s = timeout_s
        self.staging = staging
        offline = settings.sandbox.model_copy(update={"network": "none"})
        self.sandbox: Sandbox = make_sandbox(offline, read_only=(*checkout.shared_paths, staging))
        self.confined = backend(settings.sandbox.backend).confines  # "none" runs on the host: nothing is confined
        self.limits = settings.sandbox.limits

    def fresh(self, name: str) -> Path:
        """An empty directory ``name`` in the staging directory (what was there before removed)."""
        into = self.staging / name
        shutil.rmtree(into, ignore_errors=True)
        into.mkdir(mode=0o700)
        return into

    def run_tests(self, files: Sequence[str], present: Sequence[str], command: str) -> TestRun:
        """Lay the graded files in (from the staging directory's ``graded``), then run the tests."""
        script = self._lay_script(files, present, self.staging / "graded")
        outcome = self._run(f"{script}\necho {_TESTS}\n{command}", self.timeout_s)
        before, marked, after = outcome.output.partition(_TESTS + "\n")
        if not marked:
            raise GradingError(mask(f"the graded files were not laid in: {before.strip()[-300:] or outcome.error}"))
        lines = after.splitlines()
        code = exit_code_of(lines[-1]) if lines else None
        output = "\n".join(lines[:-1] if code is not None else lines)
        timed_out = outcome.error is not None and "timed out" in outcome.error
        return TestRun(output, code, timed_out, ran=True)

    def lay(self, files: Sequence[str], present: Sequence[str], source: Path) -> None:
        """Lay the files staged in ``source`` into the checkout (and remove those not staged)."""
        outcome = self._run(self._lay_script(files, present, source), LAY_TIMEOUT_S)
        lines = outcome.output.splitlines()
        if outcome.error is not None or not lines or exit_code_of(lines[-1]) != 0:
            raise GradingError(mask(f"the files were not laid in: {outcome.output.strip()[-300:] or outcome.error}"))

    def _lay_script(self, files: Sequence[str], present: Sequence[str], source: Path) -> str:
        staging = shlex.quote(str(source))  # bound at its own path
        given = set(present)
        steps = []
        for path in files:
            quoted = shlex.quote(path)
            steps.append(f"rm -rf -- {quoted}")
            if path in given:
                steps.append(f'mkdir -p -- "$(dirname -- {quoted})" && cp -P --preserve=mode -- {staging}/{quoted} '
                             f"{quoted} || exit {_LAY_FAILED}")
        return "\n".join(["set -u", *steps])

    def _run(self, script: str, timeout_s: int) -> ToolOutcome:
        confine.hand_over(self.staging, self.sandbox.user)  # a root worker's sandbox reads it as its own user
        options = ToolOptions(bash_timeout_s=timeout_s, max_output_chars=OUTPUT_MAX_CHARS, sandbox=self.sandbox,
                              limits=self.limits, on_start=self._started, home=self.checkout.home)
        try:
            return BashTool().run(Workspace(self.checkout.path), {"command": script}, options)
        finally:
            self.ctx.update_state(running_command=None)

    def _started(self, pgid: int) -> None:
        """Recorded as the agent's commands are: a resumed attempt makes sure it is dead."""
        running = {"pgid": pgid, "host": socket.gethostname(), "started": process_started(pgid)}
        self.ctx.update_state(running_command=running)



def record(ctx: Context, graded: Grade, files: Sequence[str], command: str, run: TestRun, restored: bool,
           duration: float, confined: bool) -> None:
    """The ``grade`` record in tools.jsonl (written after the agent's last step: no model ever reads it)."""
    tail = "\n".join(line[:300] for line in run.output.splitlines()[-TAIL_LINES:])[-TAIL_MAX_CHARS:]
    ctx.append_tool(
        TOOL_NAME,
        {"files": list(files), "command": command, "network": "none" if confined else "host"},
        "success" if graded.error is None else "error",
        int(duration * 1000),
        result={**graded.to_json(), "exit_code": run.exit_code, "restored": restored, "output_tail": mask(tail)},
        error=graded.error,
    )
