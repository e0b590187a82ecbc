"""The finish gate (issue 38 item 5, docs/finish-gate.md): the agent's first ``finish`` is answered, not accepted.

Tasuki shows the agent its change against the task's base (the stat and a capped diff), the new files (and which look
like scratch), the test files it changed, and the result of the repository's checks, all run in the task's sandbox as
the agent's own commands are. The agent may go on working; its next ``finish`` is accepted: the scratch files it did
not keep are removed, and the checks run again unless the tree is the one they judged. Both answers are tool results
recorded like any other; ``state.json``'s ``finish_gate`` says the gate ran, so a resumed task never runs it twice.
"""

from __future__ import annotations

import os
import re
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from agent.gate_report import accepted_text, review_text
from agent.scratch import is_test_file, kept_paths, scratch_files, scratch_reason
from agent.tools.protocol import ToolOutcome
from agent.tools.shell import exit_code_of
from agent.tools.workspace import ToolError, Workspace
from contexts import Context
from contexts.masking import mask
from sandbox.checks import Checks

Shell = Callable[[str, int], ToolOutcome]
"""Runs one bash command line in the checkout, in the sandbox, with a timeout in seconds (the bash tool's run)."""

DIFF_MAX_CHARS = 12_000  # of the diff the gate shows; the stat names every file
STAT_MAX_LINES = 60
RESULT_LINES = 20  # the last lines of a check's output: where test runners print their verdict
RESULT_MAX_CHARS = 3_000
CHANGES_TIMEOUT_S = 120
_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
_SECTION = "@@tasuki-gate:"  # the changes script's section markers


@dataclass(frozen=True)
class CheckResult:
    """One check as it ran: its command, exit code (None: it did not end by itself), duration and last lines."""

    command: str
    exit_code: int | None
    lines: str
    duration_s: float
    timed_out: bool = False

    @property
    def passed(self) -> bool:
        """It exited 0 within its time."""
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class Changes:
    """The working tree against the base, as git in the sandbox sees it (for the agent to read, and the new files)."""

    files: tuple[tuple[str, str], ...] = ()  # (status letter, path), paths git had to quote left out
    stat: str = ""
    diff: str = ""
    error: str = ""

    @property
    def new_files(self) -> list[str]:
        """Files the base did not have."""
        return [path for status, path in self.files if status == "A"]

    @property
    def test_files(self) -> list[tuple[str, str]]:
        """Changed test files: (status, path)."""
        return [(status, path) for status, path in self.files if is_test_file(path)]


@dataclass(frozen=True)
class GateAnswer:
    """What the loop records as ``finish``'s result: the text, whether the task ends, the structured record."""

    output: str
    finished: bool
    record: dict[str, Any] = field(default_factory=dict)


@dataclass
class FinishGate:
    """The gate of one task: the base its change is measured against, the checks, and how long one check may run."""

    base: str | None
    checks: Checks
    check_timeout_s: int = 600
    # The tree a commit would take now, by the worker's own git (worker/checkout.py ``work_tree``): the checks' results
    # are reused only for the very tree they judged. None: they always run again.
    snapshot: Callable[[], str] | None = None
    _ran: dict[str, Any] | None = field(default=None, init=False, repr=False)  # this process's review, not yet on disk

    def on_finish(self, ctx: Context, keep: object, shell: Shell, workspace: Workspace) -> GateAnswer:
        """Answer an accepted-by-its-tool ``finish``: the review the first time, else the acceptance."""
        ran = self._ran or ctx.read_state().get("finish_gate")  # two finishes in one reply: the second is accepted
        if isinstance(ran, dict) and ran.get("ran"):
            return self.accept(ctx, ran, keep, shell, workspace)
        return self.review(ctx, shell)

    def review(self, ctx: Context, shell: Shell) -> GateAnswer:
        """The first ``finish``: show the change and the checks' results; a tree unchanged since the base has
        nothing to review and is accepted at once."""
        changes = self.changes(shell)
        if not changes.files and not changes.error:
            return GateAnswer("task finished (nothing changed: no review needed)", True,
                              {"stage": "accepted", "evidence": {"unchanged": True}})
        tree = self._tree()
        results = self.run_checks(shell)
        self._ran = {"ran": True, "tree": tree, "checks": [asdict(r) for r in results]}
        ctx.stage_state(finish_gate=self._ran)
        record = {"stage": "gate", "tree": tree, "checks": [asdict(r) for r in results]}
        return GateAnswer(review_text(changes, self.checks, results, self.base), False, record)

    def accept(self, ctx: Context, ran: Mapping[str, Any], keep: object, shell: Shell,
               workspace: Workspace) -> GateAnswer:
        """The next ``finish``: remove the scratch not kept; the checks' results for the tree as delivered."""
        changes = self.changes(shell)
        kept = kept_paths(keep)
        removed = remove_scratch(workspace, scratch_files(changes.new_files, kept))
        tree = self._tree()
        reused = bool(tree) and tree == ran.get("tree")
        results = [CheckResult(**r) for r in ran.get("checks") or []] if reused else self.run_checks(shell)
        evidence = {
            "source": self.checks.source,
            "checks": [asdict(r) for r in results],
            "passed": all(r.passed for r in results) if results else None,
            "removed": removed,
            "kept": sorted(p for p in kept if scratch_reason(p) is not None),
            "checks_reused": reused,
        }
        return GateAnswer(accepted_text(results, removed, reused), True, {"stage": "accepted", "evidence": evidence})

    def _tree(self) -> str:
        return self.snapshot() if self.snapshot is not None else ""

    def changes(self, shell: Shell) -> Changes:
        """The working tree against the base, read by git in the sandbox through a scratch index (the agent's own
        index and HEAD are left as they are)."""
        if not self.base or not _SHA.match(self.base):
            return Changes(error="the task's base commit is not known")
        outcome = shell(_changes_script(self.base), CHANGES_TIMEOUT_S)
        return parse_changes(outcome.output, outcome.error)

    def run_checks(self, shell: Shell) -> list[CheckResult]:
        """Each check in the sandbox, one after another, each within ``check_timeout_s``."""
        results = []
        for command in self.checks.commands:
            started = time.monotonic()
            outcome = shell(command, self.check_timeout_s)
            results.append(check_result(command, outcome, time.monotonic() - started))
        return results


def _changes_script(base: str) -> str:
    """Bash for the sandbox: stage the tree in a scratch copy of the agent's index (its time kept, so that git's check
    for files changed in the same second as the index still holds), then the sections."""
    b = shlex.quote(base)
    return "\n".join((
        "export GIT_NO_REPLACE_OBJECTS=1 GIT_TERMINAL_PROMPT=0 GIT_OPTIONAL_LOCKS=0",
        'index="$(mktemp)"; objects="$(mktemp -d)"; trap \'rm -rf "$index" "$objects"\' EXIT',
        # what it hashes goes to a scratch object directory: the agent's repository is only read
        'export GIT_OBJECT_DIRECTORY="$objects" GIT_ALTERNATE_OBJECT_DIRECTORIES="$PWD/.git/objects"',
        'cp -p .git/index "$index" 2>/dev/null || rm -f "$index"',
        'export GIT_INDEX_FILE="$index"',
        "git add -A . >/dev/null 2>&1 || { echo 'git could not read the working tree' >&2; exit 3; }",
        f"echo {_SECTION}files; git diff --cached --name-status --no-renames {b} --",
        f"echo {_SECTION}stat; git diff --cached --stat=120 {b} -- | tail -n {STAT_MAX_LINES}",
        f"echo {_SECTION}diff; git diff --cached --no-ext-diff --no-textconv {b} -- | head -c {DIFF_MAX_CHARS + 1}",
    ))


def parse_changes(output: str, error: str | None) -> Changes:
    """The changes script's output as :class:`Changes` (its last line is the bash tool's exit code)."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    lines = output.splitlines()
    code = _last_exit(lines)
    for line in lines[:-1] if code is not None else lines:
        if line.startswith(_SECTION) and line[len(_SECTION):] in ("files", "stat", "diff"):
            current = sections.setdefault(line[len(_SECTION):], [])
        elif current is not None:
            current.append(line)
    if error is not None or code != 0 or "files" not in sections:
        return Changes(error=mask(error or output.strip()[-300:] or "git gave no answer")[:300])
    files = []
    for line in sections.get("files", []):
        status, _, path = line.partition("\t")
        if path and not path.startswith('"'):  # git quotes unusual names: shown in the stat, never acted on
            files.append((status[:1], path))
    diff = "\n".join(sections.get("diff", []))
    if len(diff) > DIFF_MAX_CHARS:
        diff = diff[:DIFF_MAX_CHARS] + "\n[... diff cut; the stat above names every file ...]"
    return Changes(tuple(files), mask("\n".join(sections.get("stat", []))), mask(diff))


def check_result(command: str, outcome: ToolOutcome, duration_s: float) -> CheckResult:
    """A check's :class:`CheckResult` from the bash tool's answer (whose last line, Tasuki's own, is the exit)."""
    lines = outcome.output.splitlines()
    code = _last_exit(lines)
    body = lines[:-1] if code is not None else lines
    tail = "\n".join(line[:300] for line in body[-RESULT_LINES:])[-RESULT_MAX_CHARS:]
    timed_out = outcome.error is not None and "timed out" in outcome.error
    return CheckResult(command, None if timed_out else code, mask(tail), round(duration_s, 2), timed_out)


def _last_exit(lines: list[str]) -> int | None:
    return exit_code_of(lines[-1]) if lines else None


def remove_scratch(workspace: Workspace, paths: list[str]) -> list[str]:
    """Delete the files ``paths`` names (beneath the checkout, never through a link); those that were there."""
    removed = []
    for path in paths:
        folder, _, name = path.strip("/").rpartition("/")
        if name in ("", ".", ".."):
            continue
        try:  # the directory is opened beneath the checkout; the file itself (a link, maybe) is unlinked, not followed
            parent = workspace.open(folder or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (ToolError, OSError):
            continue
        try:
            os.unlink(name, dir_fd=parent)
            removed.append(path)
        except OSError:  # gone already, or a directory: nothing of the agent's to delete here
            pass
        finally:
            os.close(parent)
    return removed
