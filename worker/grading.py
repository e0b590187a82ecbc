"""Grading an eval task (issue 39): once the agent's work is committed, and before it is pushed, the held-back test
patch is laid over it and its tests run in the task's sandbox with no network.

The agent never sees the test patch: it is in the Celery message and the context's metadata (neither in its sandbox),
and reaches the checkout only here, after the agent's last command is over. The worker's own git (never the agent's
``.git``) computes the graded files — the committed work with the patch's files reset to the base and the patch
applied — and writes them into a fresh directory under the task's home, from which a sandboxed call lays them into
the checkout and runs the tests; a second call lays the committed versions back. So the patch is on no command line
(only the files' names and the test command are), and nothing of it can be pushed: the push takes the commit, which
was made before. ``state.json``'s ``grading`` says while the tree holds the patch, so a resume on this host lays the
committed files back before anything else reads the tree (:func:`recover`).

A grading that fails — the patch does not apply, the tests time out or report nothing — is a :class:`Grade` with its
``error`` set and ``resolved`` False, never a failed task.
"""

from __future__ import annotations

import json
import shlex
import shutil
import socket
import tempfile
import time
from collections.abc import Mapping, Sequence
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
from sandbox.jail import Sandbox, backend, make_sandbox
from sandbox.test_results import Grade, failed_grade, grade, parse_results, test_command, test_files
from worker.checkout import Checkout
from worker.gitdirs import GitError, run_git, tree_env
from worker.settings_models import Settings

log = structlog.get_logger(__name__)

TOOL_NAME = "grade"  # its record in tools.jsonl
STAGING = (".tasuki", "grading")  # beneath the task's home: the files laid into the checkout, made afresh each time
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
    shell = GradingShell(ctx, checkout, settings, spec.timeout_s or settings.agent.check_timeout_s)
    run = TestRun()
    try:
        if not files:
            raise GradingError("the test patch touches no file")
        ctx.update_state(grading={"status": "applying", "files": files, "head": head})
        present = stage(checkout, head, base, spec.test_patch, files)
        run = shell.run_tests(files, present, command)
        graded = judge(run, spec)
    except GradingError as exc:
        graded = failed_grade(str(exc), spec.fail_to_pass, spec.pass_to_pass)
    except Exception as exc:  # never fails the task: the grade says why it could not be had
        log.exception("grading failed")
        why = mask(f"grading failed: {type(exc).__name__}: {exc}".splitlines()[0])[:500]
        graded = failed_grade(why, spec.fail_to_pass, spec.pass_to_pass)
    finally:
        restored = restore(ctx, checkout, shell, head, files)
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


def stage(checkout: Checkout, head: str, base: str, patch: str, files: Sequence[str]) -> list[str]:
    """Write the graded versions of ``files`` (the commit ``head`` with them reset to ``base``, the patch applied)
    into the staging directory, by the worker's own git in a scratch index; the files that exist after it."""
    with tempfile.TemporaryDirectory(prefix="tasuki-grading-") as scratch:
        git = _ScratchGit(checkout, Path(scratch) / "index")
        git("read-tree", head)
        at_base = git.entries(base, files)  # a file the base lacks leaves the index (mode 0)
        lines = [at_base.get(path, f"0 {'0' * 40}") + f"\t{path}" for path in files]
        git("update-index", "-z", "--index-info", stdin="\0".join(lines) + "\0")
        try:
            git("apply", "--cached", "--whitespace=nowarn", "-", stdin=patch)
        except GitError as exc:
            why = str(exc).removeprefix("git apply failed: ")
            raise GradingError(f"the test patch does not apply: {why}") from None
        return git.lay(files, _fresh_staging(checkout.home))


def restore(ctx: Context, checkout: Checkout, shell: GradingShell, head: str, files: Sequence[str]) -> bool:
    """Lay the committed versions of ``files`` back into the checkout; the staging directory goes. False (logged, and
    ``state.json`` still saying so) when they could not be: the tree is not the commit's."""
    try:
        with tempfile.TemporaryDirectory(prefix="tasuki-grading-") as scratch:
            git = _ScratchGit(checkout, Path(scratch) / "index")
            git("read-tree", head)
            present = git.lay(files, _fresh_staging(checkout.home))
        shell.lay(files, present)
    except Exception as exc:
        log.warning("the checkout was not restored after grading", error=mask(str(exc))[:300])
        return False
    finally:
        _remove_staging(checkout.home)
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
    if not restore(ctx, checkout, GradingShell(ctx, checkout, settings, LAY_TIMEOUT_S), head, files):
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
    """The worker's git on the checkout with an index of its own (the worker's and the agent's are left alone)."""

    def __init__(self, checkout: Checkout, index: Path) -> None:
        self.checkout = checkout
        self.env = {**tree_env(checkout.git_dir, checkout.path), "GIT_INDEX_FILE": str(index),
                    "GIT_LITERAL_PATHSPECS": "1", "GIT_NO_REPLACE_OBJECTS": "1"}

    def __call__(self, *args: str, stdin: str | None = None) -> str:
        return run_git(args, cwd=self.checkout.path, extra_env=self.env, stdin=stdin, timeout_s=LAY_TIMEOUT_S)

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


def _fresh_staging(home: Path) -> Path:
    """The staging directory beneath the home, empty and the worker's own (whatever was in its place removed, never
    followed: no sandboxed process runs while it is made)."""
    _remove_staging(home)
    tasuki = home / STAGING[0]
    if tasuki.is_symlink() or (tasuki.exists() and not tasuki.is_dir()):
        tasuki.unlink()
    tasuki.mkdir(mode=0o700, exist_ok=True)
    staging = tasuki / STAGING[1]
    staging.mkdir(mode=0o700)
    return staging


def _remove_staging(home: Path) -> None:
    tasuki = home / STAGING[0]
    if tasuki.is_symlink() or not tasuki.is_dir():
        return
    staging = tasuki / STAGING[1]
    if staging.is_symlink() or staging.is_file():
        staging.unlink()
    elif staging.is_dir():
        shutil.rmtree(staging, ignore_errors=True)  # fd-based: never follows a link beneath it


class GradingShell:
    """The grading's commands: bash in the task's sandbox with no network, in the checkout, with the task's home."""

    def __init__(self, ctx: Context, checkout: Checkout, settings: Settings, timeout_s: int) -> None:
        self.ctx = ctx
        self.checkout = checkout
        self.timeout_s = timeout_s
        offline = settings.sandbox.model_copy(update={"network": "none"})
        self.sandbox: Sandbox = make_sandbox(offline, read_only=checkout.shared_paths)
        self.confined = backend(settings.sandbox.backend).confines  # "none" runs on the host: nothing is confined
        self.limits = settings.sandbox.limits

    def run_tests(self, files: Sequence[str], present: Sequence[str], command: str) -> TestRun:
        """Lay the graded files in, then run the tests."""
        outcome = self._run(f"{self._lay_script(files, present)}\necho {_TESTS}\n{command}", self.timeout_s)
        before, marked, after = outcome.output.partition(_TESTS + "\n")
        if not marked:
            raise GradingError(mask(f"the graded files were not laid in: {before.strip()[-300:] or outcome.error}"))
        lines = after.splitlines()
        code = exit_code_of(lines[-1]) if lines else None
        output = "\n".join(lines[:-1] if code is not None else lines)
        timed_out = outcome.error is not None and "timed out" in outcome.error
        return TestRun(output, code, timed_out, ran=True)

    def lay(self, files: Sequence[str], present: Sequence[str]) -> None:
        """Lay the staged files into the checkout (and remove those not staged)."""
        outcome = self._run(self._lay_script(files, present), LAY_TIMEOUT_S)
        lines = outcome.output.splitlines()
        if outcome.error is not None or not lines or exit_code_of(lines[-1]) != 0:
            raise GradingError(mask(f"the files were not laid in: {outcome.output.strip()[-300:] or outcome.error}"))

    def _lay_script(self, files: Sequence[str], present: Sequence[str]) -> str:
        staging = shlex.quote(str(Path(self.sandbox.home_inside(self.checkout.home), *STAGING)))
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
