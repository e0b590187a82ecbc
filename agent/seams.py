"""What the agent is handed by the worker that runs it: a checkout it can checkpoint and restore, and a meter
that prices and counts its calls. The worker's implementations hold the git remote and Redis; the agent sees
only these methods."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from agent.llm.base import Reply
from contexts.usage import Usage


class CheckpointMark(Protocol):
    """The newest checkpoint commit the checkout made (``""``: none)."""

    latest: str


class Checkout(Protocol):
    """The task's working copy and its checkpoints on the remote."""

    @property
    def path(self) -> Path: ...

    @property
    def home(self) -> Path: ...

    @property
    def lease(self) -> CheckpointMark: ...

    def checkpoint(self, step: int) -> bool:
        """Commit the working tree as step ``step``'s checkpoint; False when nothing changed."""
        ...

    def restore_last_checkpoint(self) -> None:
        """Put the working tree back to the last checkpoint."""
        ...

    def restored_step(self) -> int | None:
        """The step the checkout was restored to on resume, when it was behind the context."""
        ...

    def restore_told(self) -> None:
        """The model was told about the restore: do not tell it again."""
        ...


class Meter(Protocol):
    """Prices each call, counts it for the fleet and says when the task's budget is spent."""

    def priced(self, usage: Usage) -> tuple[Usage, float | None]: ...

    def count(self, usage: Usage) -> None: ...

    def over_budget(self, state: dict[str, Any]) -> str | None: ...


def usage_of(reply: Reply, kind: str, estimated_prompt_tokens: int = 0, profile: str = "") -> Usage:
    """A reply's usage as its provider reported it (our estimate when it reported no prompt tokens): cache reads
    and writes included, which are part of the prompt and priced apart."""
    return Usage(
        kind=kind,
        model=reply.model,
        prompt_tokens=int(reply.prompt_tokens if reply.prompt_tokens is not None else estimated_prompt_tokens),
        completion_tokens=int(reply.completion_tokens or 0),
        cached_tokens=int(reply.cached_tokens or 0),
        cache_write_tokens=int(reply.cache_write_tokens or 0),
        profile=profile,
    )
