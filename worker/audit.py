"""``record_audit``: the one call every intake, console action and command uses to put an event in the audit log.

The settings pick the backend (``fleet.store``'s scheme, as for the other stores in :mod:`worker.stores`): the
hash-chained file beside the contexts on one host, the same chain in PostgreSQL in fleet mode. Recording never
raises to its caller — a refused trigger or a cancel must not fail because the log's disk is full — but an event
that could not be recorded is logged at error level with everything it held, so it is never lost silently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import structlog

from contexts.audit import AuditLog, AuditQuery, Event, Problem, audit_dir
from contexts.clock import utc_now
from contexts.masking import mask, mask_value
from worker.settings_models import Settings
from worker.stores import fleet_store

log = structlog.get_logger(__name__)

ACTIONS = frozenset({
    "trigger.admitted", "trigger.refused", "signin", "signin.refused", "signout", "task.submit", "task.cancel",
    "task.retry", "followup", "token.create", "token.revoke", "budget.change", "setting.change",
})
"""The actions of issue 40's contract; another is recorded all the same (and warned about), never dropped."""


class AuditBackend(Protocol):
    """Where the chained events are kept: a file (:class:`contexts.audit.AuditLog`) or PostgreSQL."""

    def append(self, event: Event) -> dict[str, Any]: ...
    def read(self, *, since: datetime | None = None) -> Iterator[dict[str, Any]]: ...
    def read_reversed(self) -> Iterator[dict[str, Any]]: ...
    def select(self, query: AuditQuery) -> Iterator[dict[str, Any]]: ...
    def verify(self) -> list[Problem]: ...


def audit_path(settings: Settings) -> Path:
    """The one-host log's directory: ``audit/`` beside the contexts root."""
    return audit_dir(Path(settings.contexts.base_dir))


def _on_disk(settings: Settings) -> AuditBackend:
    return AuditLog(audit_path(settings))


def _postgresql(settings: Settings) -> AuditBackend:
    from fleet.audit import PostgresAuditLog  # fleet mode only: one host never loads the driver

    return PostgresAuditLog(fleet_store(settings))


AUDIT_BACKENDS: dict[str, Callable[[Settings], AuditBackend]] = {
    "": _on_disk,  # fleet.store unset: audit/audit.jsonl beside the contexts
    "postgresql": _postgresql,  # every host's events in one chain in the fleet's database (fleet/audit.py)
    "postgres": _postgresql,
}
"""Where audit events are kept, by the scheme of ``fleet.store``'s URL."""


def audit_log(settings: Settings) -> AuditBackend:
    """The configured audit backend."""
    return AUDIT_BACKENDS[urlsplit(settings.fleet.store or "").scheme](settings)


def record_audit(
    settings: Settings,
    *,
    actor: str,
    action: str,
    target: str = "",
    outcome: str = "ok",
    reason: str = "",
    source: str = "",
    detail: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> None:
    """Append one event to the audit log; never raises for a storage problem (it logs the event at error level)."""
    if action not in ACTIONS:
        log.warning("audit_unknown_action", action=action)
    event = Event(at=now or utc_now(), actor=actor, action=action, target=target, outcome=outcome, reason=reason,
                  source=source, detail=detail)
    try:
        audit_log(settings).append(event)
    except Exception as exc:  # the caller's action goes on; the event is kept in the error log
        log.error(
            "audit_not_recorded", error=mask(f"{type(exc).__name__}: {exc}"), actor=actor, action=action,
            target=mask(target), outcome=outcome, reason=mask(reason), source=source,
            detail=mask_value(dict(detail or {})), at=event.at.isoformat(),
        )
