"""The task branch's diff against its base, read-only (SPEC §15): from the task's checkout while it runs, from a
local task's own repository once it finished; a forge task's finished branch is on the forge (its PR/MR link).

The checkout is the agent's: git runs there without hooks, fsmonitor, external diff drivers or text
conversions, so nothing the agent planted runs in the console's process. The diff is masked like a context.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contexts.masking import mask
from worker.checkout import GitError, run_git

MAX_DIFF_CHARS = 400_000
DIFF = ("diff", "--no-ext-diff", "--no-textconv", "--no-color")


@dataclass(frozen=True)
class BranchDiff:
    """The diff text (masked, maybe cut), or why there is none."""

    text: str | None
    note: str


def _cut(text: str) -> str:
    if len(text) <= MAX_DIFF_CHARS:
        return text
    return text[:MAX_DIFF_CHARS] + f"\n… cut: the diff has {len(text):,} characters\n"


def branch_diff(workspace: Path, metadata: Mapping[str, Any], state: Mapping[str, Any]) -> BranchDiff:
    """The task branch against its base: ``workspace`` is the task's checkout (``{workspaces_dir}/{uuid}``)."""
    result = state.get("result") if isinstance(state.get("result"), dict) else {}
    branch = str((result or {}).get("branch") or "")
    if branch.startswith("-"):  # never an option to git
        branch = ""
    try:
        if (workspace / ".git").is_dir():
            base = run_git(("merge-base", "HEAD", "origin/HEAD"), cwd=workspace).strip()
            text = run_git((*DIFF, base, "--"), cwd=workspace)
            return BranchDiff(mask(_cut(text)), "the task's checkout against its base, as it is now")
        request = metadata.get("request") if isinstance(metadata.get("request"), dict) else {}
        repo_path = (request or {}).get("repo_path")
        if branch and repo_path and Path(repo_path).is_dir():
            text = run_git((*DIFF, f"HEAD...{branch}", "--"), cwd=Path(repo_path))
            return BranchDiff(mask(_cut(text)), f"branch {branch} against the repository's HEAD")
    except GitError as exc:
        return BranchDiff(None, f"no diff: {mask(str(exc))}")
    if branch:
        return BranchDiff(None, f"the branch {branch} is on the forge; its pull/merge request shows the diff")
    return BranchDiff(None, "no branch yet")
