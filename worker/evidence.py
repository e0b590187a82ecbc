"""Evidence in the pull request (issue 38 item 6, docs/finish-gate.md): what changed, how Tasuki tested it, the files
touched, the task's steps, tokens and cost, and its page in the console; and the checks the finish gate runs, read
from the task's base commit with the worker's own git.

Everything here is read on the host through the worker's git directory (worker/gitdirs.py), never the checkout's
``.git``: blobs of the base commit and the names of the final commit's changes, as data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from contexts.masking import mask
from contexts.usage import format_cost, format_tokens
from sandbox.checks import Checks, resolve_checks
from worker.checkout import Checkout

BODY_MAX_CHARS = 60_000  # GitHub refuses a body over 65,536 characters; GitLab's and Gitea's limits are higher
SUMMARY_MAX_CHARS = 20_000
FILES_SHOWN = 100
CHECK_LINES_MAX_CHARS = 2_000  # of each check's last lines in the body
STATUS_WORDS = {"A": "added", "M": "modified", "D": "deleted", "T": "type changed"}


def base_checks(checkout: Checkout, base: str | None, operator: Sequence[str]) -> Checks:
    """The finish gate's checks as of ``base`` (the repository's ``.tasuki/checks`` there, else ``operator``, else
    detected from the base's top-level files): what the agent writes in the tree cannot change them."""
    if not base:
        return Checks(tuple(operator), "agent.checks") if operator else Checks()
    names = {name for _mode, name in _tree(checkout, base, ".")}

    def read(path: str) -> str | None:
        entries = _tree(checkout, base, path)
        if len(entries) != 1 or not entries[0][0].startswith("100"):  # a regular file, never a link or a directory
            return None
        return checkout.git("cat-file", "blob", f"{base}:{path}", check=False)

    return resolve_checks(read, names, operator)


def _tree(checkout: Checkout, commit: str, path: str) -> list[tuple[str, str]]:
    """(mode, name) of ``path`` in ``commit`` (its entries when it is ``.``, the root); [] when absent."""
    listed = checkout.git("ls-tree", "-z", commit, "--", path, check=False)
    entries = []
    for entry in listed.split("\0"):
        meta, _, name = entry.partition("\t")
        if name:
            entries.append((meta.split(" ", 1)[0], name))
    return entries


def files_touched(checkout: Checkout, base: str | None) -> list[tuple[str, str]]:
    """(status letter, path) of every file the task branch changed since ``base``."""
    if not base:
        return []
    listed = checkout.git("diff", "--name-status", "--no-renames", "-z", base, "HEAD", check=False).split("\0")
    return [(listed[i][:1], listed[i + 1]) for i in range(0, len(listed) - 1, 2) if listed[i]]


def checks_failed(evidence: Mapping[str, Any] | None) -> bool:
    """Whether the checks the gate ran on the delivered tree fail (no checks, or no gate: not failing)."""
    return bool(evidence) and evidence.get("passed") is False  # type: ignore[union-attr]


def pull_request_body(summary: str, evidence: Mapping[str, Any] | None, files: list[tuple[str, str]],
                      state: Mapping[str, Any], task_url: str | None, *, priced: bool, untested: str = "") -> str:
    """The pull/merge request's text: the summary first (its first line is a local task's title), then the evidence;
    masked and within every forge's limit. ``untested``: why no checks ran, when the gate never accepted a finish."""
    text = summary.strip()
    if len(text) > SUMMARY_MAX_CHARS:
        text = text[:SUMMARY_MAX_CHARS] + "\n[... summary cut ...]"
    parts = [text, "### How it was tested", untested or tested(evidence), "### Files touched", _files(files),
             "### The task", _task(state, task_url, priced)]
    body = mask("\n\n".join(parts))
    return body if len(body) <= BODY_MAX_CHARS else body[: BODY_MAX_CHARS - 40] + "\n\n[... cut to the forge's limit]"


def tested(evidence: Mapping[str, Any] | None) -> str:
    """The checks Tasuki ran on the delivered tree: each command, its exit status and its last lines."""
    if not evidence:
        return "Tasuki ran no checks (its finish gate is off: `agent.finish_gate`)."
    checks = evidence.get("checks") or []
    if not checks:
        return "No checks are declared (`.tasuki/checks`, `agent.checks`) and no test command was detected."
    failed = sum(1 for c in checks if not _passed(c))
    verdict = f"**{failed} of {len(checks)} checks fail**" if failed else f"All {len(checks)} checks pass"
    parts = [f"{verdict} (declared by {evidence.get('source') or 'the operator'}; run by Tasuki in the task's "
             "sandbox on the tree as delivered)."]
    for check in checks:
        lines = str(check.get("lines") or "").strip()[-CHECK_LINES_MAX_CHARS:].replace("```", "'''")
        command = str(check.get("command"))[:300].replace("`", "'")
        parts.append(f"`{command}` — {_status(check)}\n\n```\n{lines}\n```")
    if evidence.get("removed"):
        parts.append("Scratch files removed before the commit: " + ", ".join(f"`{p}`" for p in evidence["removed"]))
    return "\n\n".join(parts)


def _passed(check: Mapping[str, Any]) -> bool:
    return check.get("exit_code") == 0 and not check.get("timed_out")


def _status(check: Mapping[str, Any]) -> str:
    if check.get("timed_out"):
        return f"timed out after {float(check.get('duration_s') or 0):.0f} s"
    verdict = "passed" if _passed(check) else "failed"
    return f"exit status {check.get('exit_code')} ({verdict}) in {float(check.get('duration_s') or 0):.1f} s"


def _files(files: list[tuple[str, str]]) -> str:
    if not files:
        return "none"
    shown = [f"- `{path}` ({STATUS_WORDS.get(status, status)})" for status, path in files[:FILES_SHOWN]]
    more = len(files) - FILES_SHOWN
    return "\n".join(shown) + (f"\n- and {more} more" if more > 0 else "")


def _task(state: Mapping[str, Any], task_url: str | None, priced: bool) -> str:
    calls, tools = int(state.get("llm_call_count", 0)), int(state.get("tool_call_count", 0))
    cost = format_cost((state.get("usage") or {}).get("cost_usd"), priced)
    lines = [f"- Steps: {calls} model calls, {tools} tool runs", f"- Tokens: {format_tokens(state)}", f"- Cost: {cost}"]
    if task_url:
        lines.append(f"- Its page in the console: {task_url}")
    return "\n".join(lines)


def task_page(public_url: str | None, uuid: str) -> str | None:
    """The task's page in the console (``console.public_url``), or None when no public address is set."""
    return f"{public_url.rstrip('/')}/tasks/{uuid}" if public_url else None
