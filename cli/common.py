"""What the commands share: printing, one-line usage errors, dates, the contexts root's edge."""

from __future__ import annotations

import re
import shutil
import sys
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

from contexts.errors import InvalidUUIDError, TasukiError

if TYPE_CHECKING:
    from contexts.store import ContextStore

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


def locate_inside(store: ContextStore, uuid: str) -> Path:
    """The directory of ``uuid``; refuses one that resolves outside the contexts root (a symlink)."""
    directory = store.locate(uuid)  # also rejects anything that is not a canonical UUID, e.g. ../../etc
    root = store.base_dir.resolve()
    if not directory.resolve().is_relative_to(root):
        raise InvalidUUIDError(f"context {uuid} leads outside the contexts root {root}")
    return directory


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
