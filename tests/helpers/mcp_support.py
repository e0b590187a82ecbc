"""What the MCP tests share: finding the processes of one test's servers by a marker on their command line."""

from __future__ import annotations

from pathlib import Path


def processes_with(marker: str) -> list[int]:
    """Processes whose command line holds ``marker`` (pytest's own excepted)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in line and "pytest" not in line:
            found.append(int(entry.name))
    return found
