"""Grading an eval task (issue 39), as SWE-bench grades: once the agent's work is committed, and before it is pushed,
the held-back test patch is laid over the COMMIT and its tests run in the task's sandbox with no network — in a fresh
tree and a fresh home, never the agent's.

The worker's own git (never the agent's ``.git``) writes the commit's tree, the patch's files reset to the base and the
patch applied, into a private directory of its own (in its temporary directory, which no sandbox shows) from a scratch
index, with no system or user config and no attributes file (so no attribute of the agent's names a filter it would
run). Beside it goes a fresh home. The environment is the one its setup left, never the one the agent left: when the
task's environment has a snapshot on this host (``state.json``'s ``environment.key``), its home and its checkout paths
(``.venv``...) are copied into the fresh home and tree; when it has none (nothing declared, the setup failed, or
``sandbox.backend: none``) the home is empty. So nothing the agent left uncommitted — an ignored ``.venv/bin/python``,
a ``BASH_ENV`` in its env files, a ``usercustomize.py`` in its home — reaches the test run, and the agent's checkout
and home are never written. The patch is on no command line (only the test command is), and nothing of it can be
pushed: the push takes the commit, which was made before. ``state.json``'s ``grading`` names the directory while the
tests run, so a resume on this host removes what a killed holder left (:func:`recover`).

A grading that fails — the patch does not apply, the tests time out or report nothing — is a :class:`Grade` with its
``error`` set and ``resolved`` False, never a failed task.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from agent.tools.shell import exit_code_of
from contexts import Context
from contexts.masking import mask
from sandbox import confine
from sandbox.jail import backend
from sandbox.test_results import Grade, failed_grade, grade, parse_results, test_command, test_files
from worker.checkout import Checkout
from worker.gitdirs import GitError, run_git, tree_env
from worker.grading_tree import (
    NO_ENVIRONMENT,
    GradingArea,
    GradingError,
    GradingShell,
    grading_area,
    lay_committed,
    lay_environment,
    remove_area,
    write_tree,
)
from worker.settings_models import Settings

__all__ = ["Grading", "GradingError", "TestRun", "check_files", "grade_work", "judge", "recover"]

log = structlog.get_logger(__name__)

TOOL_NAME = "grade"  # its record in tools.jsonl
TAIL_LINES = 40  # of the test run's output kept in the record
TAIL_MAX_CHARS = 4_000
FRESH = "fresh"  # state.json's grading.tree: the tests ran in a tree of their own, never the checkout


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
    """Grade the committed work in a fresh tree and home in the sandbox; the grade as the task's result holds it
    (with ``duration_s``)."""
    started = time.monotonic()
    spec = Grading.from_json(request)
    files = test_files(spec.test_patch)
    command = test_command(spec.test_command, spec.parser, files)
    head = checkout.head()
    run, environment = TestRun(), NO_ENVIRONMENT
    with grading_area() as area:
        try:
            check_files(files)
            ctx.update_state(grading={"status": "running", "tree": FRESH, "area": str(area.path), "files": files,
                                      "head": head})
            write_tree(checkout, head, base, spec.test_patch, files, area.tree)
            environment = lay_environment(ctx, settings, area)
            run = run_tests(ctx, settings, area, spec.timeout_s or settings.agent.check_timeout_s, command)
            graded = judge(run, spec)
        except GradingError as exc:
            graded = failed_grade(str(exc), spec.fail_to_pass, spec.pass_to_pass)
        except Exception as exc:  # never fails the task: the grade says why it could not be had
            log.exception("grading failed")
            why = mask(f"grading failed: {type(exc).__name__}: {exc}".splitlines()[0])[:500]
            graded = failed_grade(why, spec.fail_to_pass, spec.pass_to_pass)
    if ctx.read_state().get("grading"):
        ctx.update_state(grading={"status": "done", "tree": FRESH, "files": files, "head": head})
    duration = time.monotonic() - started
    result = {**graded.to_json(), "duration_s": round(duration, 2)}
    record(ctx, graded, files, command, run, environment, duration, backend(settings.sandbox.backend).confines)
    log.info("task graded", resolved=graded.resolved, error=graded.error, failed=graded.failed[:20],
             environment=environment, duration_s=round(duration, 1))
    return result


@dataclass(frozen=True)
class TestRun:
    """What the grading call gave: the tests' output, its exit code, whether it timed out."""

    __test__ = False  # pytest: a class named Test* that is no test
    output: str = ""
    exit_code: int | None = None
    timed_out: bool = False
    ran: bool = False


def run_tests(ctx: Context, settings: Settings, area: GradingArea, timeout_s: int, command: str) -> TestRun:
    """The test command in the sandbox, in the area's tree with its home (both the sandbox user's first)."""
    shell = GradingShell(ctx, settings, timeout_s, area.tree, area.home)
    confine.hand_over(area.tree, shell.sandbox.user)
    confine.hand_over(area.home, shell.sandbox.user)
    outcome = shell.run(command)
    lines = outcome.output.splitlines()
    code = exit_code_of(lines[-1]) if lines else None
    output = "\n".join(lines[:-1] if code is not None else lines)
    timed_out = outcome.error is not None and "timed out" in outcome.error
    return TestRun(output, code, timed_out, ran=True)


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
    :class:`GradingError` before anything is written."""
    if not files:
        raise GradingError("the test patch touches no file")
    for path in files:
        parts = path.split("/")
        if path.startswith("/") or any(part in ("", ".", "..") or part.lower() == ".git" for part in parts):
            raise GradingError(mask(f"the test patch names a path outside the tree: {path[:200]!r}"))


def recover(ctx: Context, checkout: Checkout, settings: Settings) -> None:
    """A resumed task whose last holder stopped while grading: the directory it graded in goes (on this host); a
    checkout an older version of the grading laid the test patch into gets the committed files back before the
    agent or a commit can see the tree."""
    grading = ctx.read_state().get("grading") or {}
    head, files = str(grading.get("head") or ""), [str(path) for path in grading.get("files") or ()]
    done = {"status": "done", "files": files, "head": head}
    if grading.get("status") == "running":  # this version's: the checkout was never written
        log.info("the last holder stopped while grading in a fresh tree; the checkout holds none of the test patch")
        remove_area(grading.get("area"))
        ctx.update_state(grading={**done, "tree": FRESH})
        return
    if grading.get("status") != "applying" or not head:
        return
    if not _has_commit(checkout, head):  # a takeover set the old tree aside: this one is the remote's (never patched)
        log.info("the last holder stopped while grading; its tree was set aside, so no test patch is left in it")
        ctx.update_state(grading=done)
        return
    log.warning("the last holder stopped while grading in the checkout (an older version); the committed files are "
                "laid back")
    try:
        lay_committed(ctx, checkout, settings, head, files)
    except (GradingError, GitError, OSError) as exc:
        log.warning("the checkout was not restored after grading", error=mask(str(exc))[:300])
        raise GradingError("the test patch an interrupted grading laid into the tree could not be removed") from None
    ctx.update_state(grading=done)


def _has_commit(checkout: Checkout, commit: str) -> bool:
    """Whether the worker's git of the checkout holds ``commit``."""
    try:
        run_git(("cat-file", "-e", f"{commit}^{{commit}}"), cwd=checkout.path,
                extra_env=tree_env(checkout.git_dir, checkout.path))
    except GitError:
        return False
    return True


def record(ctx: Context, graded: Grade, files: Sequence[str], command: str, run: TestRun, environment: str,
           duration: float, confined: bool) -> None:
    """The ``grade`` record in tools.jsonl (written after the agent's last step: no model ever reads it)."""
    tail = "\n".join(line[:300] for line in run.output.splitlines()[-TAIL_LINES:])[-TAIL_MAX_CHARS:]
    ctx.append_tool(
        TOOL_NAME,
        {"files": list(files), "command": command, "network": "none" if confined else "host"},
        "success" if graded.error is None else "error",
        int(duration * 1000),
        result={**graded.to_json(), "exit_code": run.exit_code, "tree": FRESH, "environment": environment,
                "graded_in": f"graded in a fresh tree; environment: {environment}", "output_tail": mask(tail)},
        error=graded.error,
    )
