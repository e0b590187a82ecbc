"""A file's text as numbered lines (``cat -n`` style), shown a window at a time.

Lines are split on ``\\n`` only, as grep, sed and ``search`` count them, so a line number means the same
thing in every tool; a ``\\r`` before the newline is not shown.
"""

from __future__ import annotations

from dataclasses import dataclass

# One minified or generated line must not fill the window on its own.
MAX_LINE_CHARS = 2000
# Room kept for the footer when a window is sized to a character budget.
_FOOTER_CHARS = 200


def split_lines(text: str) -> list[str]:
    """The file's lines without their newline; a last line without one still counts, an empty file has none."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def numbered(line: str, number: int) -> str:
    """One line as read_file shows it: its number right-aligned, a tab, the text (long lines cut)."""
    line = line.removesuffix("\r")
    if len(line) > MAX_LINE_CHARS:
        line = f"{line[:MAX_LINE_CHARS]}… [line cut: {len(line) - MAX_LINE_CHARS} more characters]"
    return f"{number:>6}\t{line}"


@dataclass(frozen=True)
class Window:
    """Lines ``first``..``last`` (1-based, inclusive) of a file of ``total`` lines, numbered."""

    body: str
    first: int
    last: int
    total: int

    @property
    def footer(self) -> str:
        """Where the window is in the file, and how to go on when it does not reach the end."""
        if self.total == 0:
            return "[empty file: 0 lines]"
        if self.first == 1 and self.last == self.total:
            return f"[the whole file: {self.total} line{'s' if self.total > 1 else ''}]"
        more = f"; more: offset={self.last + 1}" if self.last < self.total else "; end of file"
        return f"[lines {self.first}-{self.last} of {self.total}{more}]"


def window(lines: list[str], offset: int, limit: int, max_chars: int) -> Window:
    """Up to ``limit`` lines from line ``offset`` (1-based), stopping early at a line boundary when the numbered
    text would pass ``max_chars`` (at least one line is always shown)."""
    budget = max(max_chars - _FOOTER_CHARS, 0)
    shown: list[str] = []
    used = 0
    for number in range(offset, min(offset + limit, len(lines) + 1)):
        line = numbered(lines[number - 1], number)
        if shown and used + len(line) + 1 > budget:
            break
        shown.append(line)
        used += len(line) + 1
    last = offset + len(shown) - 1
    return Window("\n".join(shown), offset if shown else 0, last if shown else 0, len(lines))


def snippet(lines: list[str], first: int, last: int, context: int = 3, max_lines: int = 40) -> str:
    """Lines ``first``..``last`` with ``context`` lines around them, numbered; long spans keep their head."""
    start = max(first - context, 1)
    end = min(last + context, len(lines), start + max_lines - 1)
    return "\n".join(numbered(lines[n - 1], n) for n in range(start, end + 1))
