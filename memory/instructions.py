"""The repository owner's instruction files (SPEC §13), read from a task's checkout."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from contexts.masking import mask

INSTRUCTION_FILES = (
    "AGENTS.md",
    "CLAUDE.md",
    ".github/copilot-instructions.md",
    ".cursorrules",
    ".openhands/microagents/repo.md",
)
MAX_FILE_BYTES = 64 * 1024  # an instruction file larger than this is read this far


def nested_agents_files(touched: Iterable[str]) -> list[str]:
    """``AGENTS.md`` of every directory above the paths a task touches (nearest last), without the root's."""
    found: dict[str, None] = {}
    for path in touched:
        parts = Path(path).parts[:-1]
        for depth in range(1, len(parts) + 1):
            found[str(Path(*parts[:depth]) / "AGENTS.md")] = None
    return list(found)


def read_instructions(checkout: Path, touched: Iterable[str] = ()) -> list[tuple[str, str]]:
    """``(relative path, text)`` of each instruction file present in the checkout, in SPEC §13's order.

    Files are read only when they are regular files inside the checkout (a symlink out of it is skipped).
    """
    root = checkout.resolve()
    found = []
    for name in (*INSTRUCTION_FILES, *nested_agents_files(touched)):
        path = checkout / name
        try:
            if path.is_symlink() or not path.is_file() or not path.resolve().is_relative_to(root):
                continue
            with path.open("rb") as handle:
                text = handle.read(MAX_FILE_BYTES).decode("utf-8", errors="replace")
        except OSError:
            continue
        if text.strip():
            found.append((name, mask(text)))
    return found
