"""What one attempt of a task did, recorded in its result for the pick (docs/attempts.md): the lines it changed since
the task's base, its diff (for a reviewer), and whether the finish gate's checks passed on the tree it delivered.

Read through the worker's own git on the host, like the evidence of the pull request (worker/evidence.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker.checkout import Checkout

DIFF_MAX_CHARS = 100_000  # of the diff kept for a reviewer; the line count is always exact


def attempt_work(checkout: Checkout, base: str | None, evidence: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{"changed_lines", "diff", "checks_passed"}``: checks_passed None when the gate ran no checks (off, none)."""
    if not base:
        return {"changed_lines": 0, "diff": "", "checks_passed": None}
    lines = 0
    for row in checkout.git("diff", "--numstat", "--no-renames", base, "HEAD", check=False).splitlines():
        added, _, rest = row.partition("\t")
        removed = rest.partition("\t")[0]
        lines += sum(int(n) for n in (added, removed) if n.isdigit())  # a binary file counts "-": no lines
    diff = checkout.git("diff", "--no-renames", base, "HEAD", check=False)
    passed = evidence.get("passed") if evidence and evidence.get("checks") else None
    return {"changed_lines": lines, "diff": diff[:DIFF_MAX_CHARS],
            "checks_passed": passed if isinstance(passed, bool) else None}
