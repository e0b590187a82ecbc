"""The task branch's diff against its base, read-only (SPEC §15): from the task's checkout while it runs, from a
local task's own repository once it finished; a forge task's finished branch is on the forge (its PR/MR link).

The checkout is the agent's: git runs there with the worker's own git directory of it, never the checkout's ``.git``
(worker/gitdirs.py), and without external diff drivers or text conversions, so nothing the agent planted runs in the
console's process. The diff is masked like a context.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contexts.masking import mask
from sandbox.setup import worker_git_dir
from worker.gitdirs import GitError, run_git, tree_env

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
        if worker_git_dir(workspace).is_dir() and workspace.is_dir():
            env = tree_env(worker_git_dir(workspace), workspace)
            base = run_git(("merge-base", "HEAD", "origin/HEAD"), cwd=workspace, extra_env=env).strip()
            text = run_git((*DIFF, base, "--"), cwd=workspace, extra_env=env)
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
