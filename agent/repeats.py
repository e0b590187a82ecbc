"""A model caught in a loop: the same call, answered the same way, again and again.

A small local model (Qwen2.5-Coder-1.5B on the mined itsdangerous set) ran ``git status`` 28 times in a row, and
``git checkout -b 2.1.x`` 30 times, each answer the same as the last, until its step limit. From the
:data:`WARN_AT`-th time in a row that one call (its tool and arguments) gives one output, the result the model reads
says so; at ``agent.max_repeats`` the task stops as a ``model`` stop (docs/endings.md) instead of spending the rest
of its steps. The count lives in ``state.json`` (``repeat``), so a resumed task goes on counting.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

WARN_AT = 3  # the first repeat the model is told of


@dataclass
class Repeats:
    """The newest call's fingerprint and how many times in a row it has come back unchanged."""

    key: str = ""
    count: int = 0

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Repeats:
        recorded = state.get("repeat")
        if not isinstance(recorded, Mapping):
            return cls()
        return cls(str(recorded.get("key") or ""), int(recorded.get("count") or 0))

    def seen(self, name: str, arguments: Any, output: str) -> int:
        """Count one answered call; how many times in a row this call has now given this output."""
        key = fingerprint(name, arguments, output)
        self.count = self.count + 1 if key == self.key else 1
        self.key = key
        return self.count

    def state(self) -> dict[str, Any]:
        return {"key": self.key, "count": self.count}


def fingerprint(name: str, arguments: Any, output: str) -> str:
    """A short digest of a call and its output (nothing of either is kept)."""
    text = json.dumps([name, arguments, output], sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:16]


def note(count: int, limit: int) -> str:
    """What the model reads after a result it has had ``count`` times in a row ("" below :data:`WARN_AT`)."""
    if count < WARN_AT or count >= limit:
        return ""
    left = limit - count
    return (f"\n\n[Tasuki: this exact call has now given this exact result {count} times in a row. Running it again "
            "will not change anything: do something different (read a file, edit, run another command) or call "
            f"finish. {left} more identical repeat{'s' if left != 1 else ''} and the task stops.]")
