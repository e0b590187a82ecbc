"""Metering of model calls (SPEC §16): each call's usage from the provider's answer, priced, added to its
task's ``state.json`` and to the Redis counters that budgets and ``/metrics`` read."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import redis
import structlog

from contexts import Context, ContextStore
from contexts.clock import utc_now
from contexts.errors import StoreUnavailable
from contexts.names import FINAL_STATUSES
from contexts.state import add_calls, update_state
from contexts.usage import Usage, call_record, cost_of, over_task_limit
from worker.runtime import context_store
from worker.settings_models import LimitSettings, Settings
from worker.spend import count_usage

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Meter:
    """Prices calls and counts them under their repository; a Redis that does not answer only costs a log line
    (the task's own ``state.json`` is what the task budget reads)."""

    settings: Settings
    repo: str
    client: Callable[[], redis.Redis] | None = None
    clock: Callable[[], datetime] = utc_now
    profile: str = ""
    """The task's model profile: a call that names none was made with it."""
    team: str = ""
    """The team the task was submitted by (issue 40): its calls' cost counts toward ``limits.team_cost`` too."""

    @property
    def limits(self) -> LimitSettings:
        """The configured budgets."""
        return self.settings.limits

    def priced(self, usage: Usage) -> tuple[Usage, float | None]:
        """The call (with the task's profile unless it names its own) and its cost: ``pricing``, else the built-in
        price of its model; ``None`` without either."""
        if self.profile and not usage.profile:
            usage = replace(usage, profile=self.profile)
        return usage, cost_of(usage, self.settings.prices())

    def figures(self, usage: Usage) -> dict[str, Any]:
        """The per-call record kept beside a step or a summary."""
        return call_record(*self.priced(usage))

    def count(self, usage: Usage) -> None:
        """Add the call to the repository's day and the fleet's totals in Redis."""
        if self.client is None:
            return
        try:
            count_usage(self.client(), self.repo, *self.priced(usage), self.clock(), self.team)
        except redis.RedisError as exc:
            log.warning("usage not counted in Redis", error=str(exc)[:300])

    def over_budget(self, state: dict[str, Any]) -> str | None:
        """Why the task must stop now (its figures against its cap), or ``None``."""
        return over_task_limit(state.get("usage"), self.limits.task_tokens, self.limits.task_cost)

    def record(self, ctx: Context, usage: Usage) -> None:
        """A call made for a running task besides its steps (a summary, an embedding): into its totals and Redis."""
        ctx.update_state(usage=[self.priced(usage)])
        self.count(usage)

    def embeddings_into(self, ctx: Context) -> Callable[[int], None]:
        """What an embedder tells the tokens of each answer to, for the running task ``ctx``."""
        model = str(self.settings.memory.embedder)
        return lambda tokens: self.record(ctx, Usage("embedding", model, tokens))

    def record_finished(self, directory: Path | None, usages: Sequence[Usage], uuid: str | None = None) -> None:
        """Calls made for a task that has ended (a memory job's): into its ``state.json`` in one write (when this host
        has its directory), in a fleet into its durable copy too (``uuid``: the directory's name by default), and
        Redis."""
        priced, now = [self.priced(usage) for usage in usages], self.clock()
        store = context_store(self.settings)
        if directory is not None:
            update_state(directory, now, fsync=True, usage=priced)
            # The index's copy of the totals too: ``tasuki usage`` reads completed contexts from the index.
            store.mirror(lambda index: index.record(directory))
        uuid = uuid or (directory.name if directory is not None else None)
        if uuid is not None:
            self._into_durable_copy(store, uuid, priced, now)
        for usage in usages:
            self.count(usage)

    @staticmethod
    def _into_durable_copy(
        store: ContextStore, uuid: str, priced: list[tuple[Usage, float | None]], now: datetime
    ) -> None:
        """Fleet mode: the calls into the committed state, under no lease, once the task is finished (no holder
        writes its state any more); a task still held keeps them in its host's ``state.json`` only."""

        def with_calls(state: dict[str, Any]) -> dict[str, Any] | None:
            if state.get("status") not in FINAL_STATUSES:
                log.warning("usage not written to the fleet's store: the task is not finished", uuid=uuid)
                return None
            add_calls(state, priced, now)
            return state

        try:
            store.durable.amend(uuid, with_calls)
        except StoreUnavailable as exc:
            log.warning("usage not written to the fleet's store", uuid=uuid, error=str(exc)[:300])
