"""What a task never commits nor pushes (SPEC §17 "Never committed"), and how the final summary names it.

Three things keep a path out, beside the repository's own ``.gitignore``: the paths a setup created (anchored
lines the setup adds to ``.git/info/exclude``), the operator's ``environments.exclude`` patterns (written there
when the checkout is prepared), and a size limit on every file the task adds or changes. The first two are
git's own ignore rules, so a file the repository tracks is still committed when it changes (git never ignores
a tracked file); the limit is applied by the checkout when it stages (worker/checkout.py).
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.settings import DEFAULT_EXCLUDE, EnvironmentsSettings

MiB = 1024 * 1024
SHOWN = 10  # entries the summary names; the rest are counted
_GLOB = "\\*?["  # characters a git pattern would read as a glob (or an escape)


@dataclass(frozen=True)
class NeverCommitted:
    """The operator's part of the rule: patterns (git's syntax) and the largest file committed."""

    patterns: tuple[str, ...] = DEFAULT_EXCLUDE
    max_file_bytes: int = 5 * MiB

    @classmethod
    def from_settings(cls, environments: EnvironmentsSettings) -> NeverCommitted:
        """The ``environments`` section's ``exclude`` and ``max_file_bytes``."""
        return cls(tuple(environments.exclude), environments.max_file_bytes)


def anchored(path: str) -> str:
    """``path`` (relative to the checkout) as a git pattern matching that path alone: ``/path``, glob
    characters escaped; a trailing ``/`` (a directory) is kept."""
    name = path
    while name.startswith("./"):
        name = name[2:]
    name = name.lstrip("/")
    escaped = "".join(f"\\{c}" if c in _GLOB else c for c in name)
    if escaped.endswith(" "):  # git drops trailing spaces unless escaped
        escaped = escaped[:-1] + "\\ "
    return f"/{escaped}"


def add_lines(exclude_file: Path, lines: Iterable[str]) -> list[str]:
    """Append the ``lines`` ``exclude_file`` does not hold yet (idempotent); returns those appended."""
    exclude_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    present = set(exclude_file.read_text().splitlines()) if exclude_file.exists() else set()
    new = [line for line in dict.fromkeys(lines) if line and line not in present]
    if new:
        with open(exclude_file, "a") as out:
            if exclude_file.stat().st_size and not exclude_file.read_bytes().endswith(b"\n"):
                out.write("\n")
            out.write("".join(f"{line}\n" for line in new))
        os.chmod(exclude_file, 0o600)
    return new


def over_limit(root: Path, names: Iterable[str], limit: int) -> dict[str, int]:
    """The regular files among ``names`` (relative to ``root``) larger than ``limit`` bytes: name -> size."""
    found = {}
    for name in names:
        if not name:
            continue
        try:
            info = os.lstat(root / name)
        except OSError:  # deleted: nothing to keep out
            continue
        if stat.S_ISREG(info.st_mode) and info.st_size > limit:
            found[name] = info.st_size
    return found


def ancestors(name: str) -> list[str]:
    """The directories ``name`` is in, outermost first, each with a trailing ``/``."""
    parts = name.split("/")[:-1]
    return ["/".join(parts[: n + 1]) + "/" for n in range(len(parts))]


def group_excluded(files: Iterable[str], ignored_dirs: set[str]) -> dict[str, int]:
    """Files left out by an ignore rule, counted under the outermost ignored directory each is in (else alone)."""
    groups: Counter[str] = Counter()
    for name in files:
        label = next((d for d in ancestors(name) if d in ignored_dirs), name)
        groups[label] += 1
    return dict(groups)


def size_text(size: int) -> str:
    """``12 MB``, ``5.5 MB``, ``300 KB``, ``12 bytes``."""
    for unit, scale in (("GB", 1024 * MiB), ("MB", MiB), ("KB", 1024)):
        if size >= scale:
            value = size / scale
            text = f"{value:.1f}" if value < 10 else f"{value:.0f}"
            return f"{text.removesuffix('.0')} {unit}"
    return f"{size} bytes"


@dataclass(frozen=True)
class LeftOut:
    """What the final commit left out: paths the ignore rules above dropped (label -> files; a directory's label
    ends in ``/``) and files over the limit (name -> bytes)."""

    excluded: dict[str, int] = field(default_factory=dict)
    oversized: dict[str, int] = field(default_factory=dict)
    limit: int = 0

    def __bool__(self) -> bool:
        return bool(self.excluded or self.oversized)

    def entries(self) -> list[str]:
        """One phrase per path: ``.venv/ (1,952 files)``, ``data.bin (12 MB > 5 MB)``."""
        phrases = []
        for label, count in sorted(self.excluded.items()):
            phrases.append(f"{label} ({count:,} file{'s' if count != 1 else ''})" if label.endswith("/") else label)
        for name, size in sorted(self.oversized.items()):
            phrases.append(f"{name} ({size_text(size)} > {size_text(self.limit)})")
        return phrases

    def describe(self) -> str:
        """The summary's line (``""`` when nothing was left out); at most :data:`SHOWN` paths named."""
        phrases = self.entries()
        if not phrases:
            return ""
        more = len(phrases) - SHOWN
        named = ", ".join(phrases[:SHOWN]) + (f" and {more:,} more" if more > 0 else "")
        return f"left out of the commit: {named}"


def with_note(summary: str, note: str) -> str:
    """``summary`` followed by ``note`` in a paragraph of its own (``summary`` alone when there is no note)."""
    return f"{summary.rstrip()}\n\n{note}".strip() if note else summary


def zsplit(listed: str) -> Sequence[str]:
    """git's ``-z`` output as names."""
    return [name for name in listed.split("\0") if name]
