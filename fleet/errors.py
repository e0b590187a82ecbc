"""The fleet store's errors: one line each for an operator, in Tasuki's one hierarchy (picklable)."""

from __future__ import annotations

from contexts.errors import StoreUnavailable, TasukiError


class FleetError(TasukiError):
    """Something is wrong with the fleet's store (fleet.store)."""


class FleetUnavailable(FleetError, StoreUnavailable):
    """The fleet's PostgreSQL cannot be reached, or refused the connection."""


class SchemaTooNew(FleetError):
    """The database was migrated by a newer Tasuki than this one."""
