"""What the finish gate says to the agent: the review of its first ``finish`` and the line of its accepted one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.scratch import scratch_reason
from sandbox.checks import Checks

if TYPE_CHECKING:
    from agent.finish_gate import Changes, CheckResult

REVIEW_HEAD = (
    "Not finished yet: Tasuki's finish gate reviewed your change first. Read it, fix what is wrong (a failing check, "
    "an unintended edit, a weakened test), then call finish again: the next finish is accepted."
)
STATUS_WORDS = {"A": "added", "M": "modified", "D": "deleted", "T": "type changed"}


def review_text(changes: Changes, checks: Checks, results: list[CheckResult], base: str | None) -> str:
    """The gate's answer to the first ``finish``."""
    parts = [REVIEW_HEAD, f"## Your change against the base ({(base or 'unknown')[:12]})"]
    if changes.error:
        parts.append(f"(the diff could not be read: {changes.error})")
    else:
        parts.append(f"{changes.stat.strip(chr(10))}\n\n```diff\n{changes.diff.strip()}\n```")
    parts.append(_new_files(changes.new_files))
    tests = changes.test_files
    if tests:
        named = "\n".join(f"- {path} ({STATUS_WORDS.get(status, status)})" for status, path in tests)
        parts.append("## Test files you changed\n" + named + "\nA test you changed must still test what it tested "
                     "before: do not weaken or delete a test to make it pass.")
    parts.append(checks_text(checks, results))
    return "\n\n".join(parts)


def _new_files(paths: list[str]) -> str:
    if not paths:
        return "## New files\nnone"
    lines = []
    for path in paths:
        reason = scratch_reason(path)
        lines.append(f"- {path}" + (f"  <- looks like scratch ({reason}): removed when you finish, unless you name "
                                    "it in finish's `keep`" if reason else ""))
    return "## New files\n" + "\n".join(lines)


def checks_text(checks: Checks, results: list[CheckResult]) -> str:
    """The checks' section: where they were declared, each command, its exit status and its last lines."""
    if not results:
        return ("## Checks\nNo checks are declared (.tasuki/checks, agent.checks) and no test command was detected: "
                "run the tests that cover your change yourself.")
    parts = [f"## Checks ({checks.source}), run in the sandbox"]
    for result in results:
        parts.append(f"$ {result.command}\n{status_line(result)}\n{result.lines.strip()}".rstrip())
    return "\n\n".join(parts)


def status_line(result: CheckResult) -> str:
    """``exit 0 (passed) in 1.2 s``, ``timed out after 600 s``."""
    if result.timed_out:
        return f"timed out after {result.duration_s:.0f} s"
    verdict = "passed" if result.passed else "failed"
    return f"exit {result.exit_code} ({verdict}) in {result.duration_s:.1f} s"


def accepted_text(results: list[CheckResult], removed: list[str], reused: bool) -> str:
    """The accepted ``finish``'s result: the checks' verdict as delivered, and the scratch removed."""
    lines = ["task finished"]
    if results:
        failed = [r.command for r in results if not r.passed]
        verdict = f"{len(failed)} of {len(results)} checks fail" if failed else f"all {len(results)} checks pass"
        lines.append(f"checks: {verdict}" + (" (as the gate ran them: the tree is unchanged)" if reused else ""))
    if removed:
        lines.append("scratch files removed: " + ", ".join(removed))
    return "\n".join(lines)
