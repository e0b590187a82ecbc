"""Which files hold the repository owner's instructions (SPEC §13): the root's, and nested ones per directory.

Their text is read from the commit a task started from, never from the checkout the agent writes
(``worker/instructions.py``); how they reach the model is ``agent/instructions.py``.
"""

from __future__ import annotations

from pathlib import PurePosixPath

INSTRUCTION_FILES = (
    "AGENTS.md",
    "CLAUDE.md",
    ".github/copilot-instructions.md",
    ".cursorrules",
    ".openhands/microagents/repo.md",
)
"""The root's instruction files, in the order they are given."""
NESTED_FILES = ("AGENTS.md", "CLAUDE.md")
"""The instruction files a directory below the root may hold (Codex reads AGENTS.md, Claude Code CLAUDE.md)."""
MAX_FILE_BYTES = 64 * 1024  # an instruction file larger than this is read this far


def nested_candidates(path: str) -> list[str]:
    """The nested instruction files that would apply to ``path`` (a file or a directory): those of every directory
    from the root's child down to ``path`` itself, outermost first; the root's own are not among them."""
    parts = [p for p in PurePosixPath(path).parts if p not in ("", ".", "/")]
    if ".." in parts:
        return []
    return [str(PurePosixPath(*parts[:depth], name)) for depth in range(1, len(parts) + 1) for name in NESTED_FILES]


def is_instruction_file(path: str) -> bool:
    """Whether ``path`` (relative to the root) is one of the root's instruction files or a nested one."""
    return path in INSTRUCTION_FILES or PurePosixPath(path).name in NESTED_FILES
