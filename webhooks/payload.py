"""Reading webhook payloads of any shape: a missing or mistyped part is simply absent."""

from __future__ import annotations

from typing import Any


def get(data: Any, *path: str) -> Any:
    """``data[path[0]][path[1]]...``, or None as soon as a step is missing or not a mapping."""
    for key in path:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def text(value: Any) -> str:
    """``value`` when it is a string, else the empty string."""
    return value if isinstance(value, str) else ""


def number(value: Any) -> int | None:
    """``value`` when it is a positive integer (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
