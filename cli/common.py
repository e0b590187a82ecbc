"""What the commands share: printing, one-line usage errors, dates."""

from __future__ import annotations

import re
import shutil
import sys
from datetime import date

from contexts.errors import TasukiError

_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


class UsageError(TasukiError):
    """The command line itself is wrong: an unknown option, a malformed date, conflicting flags."""


def warn(text: str) -> None:
    """One warning line on stderr, beside the command's output (masked like every error line)."""
    from contexts.masking import mask

    sys.stderr.write(f"tasuki: warning: {mask(text)}\n")


def note(text: str) -> None:
    """One line on stderr about the output (how much of it there is), never mixed into stdout's data."""
    sys.stderr.write(f"tasuki: note: {text}\n")


def out(text: str) -> None:
    """Print one block of output and flush it (a pipe reader such as ``head`` sees it at once)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def terminal_width() -> int:
    """Columns to fit one-line views into (``$COLUMNS`` when set, 100 when not a terminal)."""
    return max(shutil.get_terminal_size((100, 24)).columns, 40)


def parse_day(text: str | None, option: str) -> date | None:
    """A ``YYYY-MM-DD`` option value as a date; a one-line error when it is not one."""
    if text is None:
        return None
    try:
        if not _DAY.fullmatch(text):
            raise ValueError("expected YYYY-MM-DD")
        return date.fromisoformat(text)
    except ValueError as exc:
        raise UsageError(f"{option} {text!r} is not a date: {exc}") from None
