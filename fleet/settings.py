"""The ``fleet`` configuration section (SPEC §12): unset, one host as always; set, the fleet's store in PostgreSQL."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import field_validator

from contexts.sections import Section

STORE_SCHEMES = ("postgresql", "postgres")


class FleetSettings(Section):
    store: str | None = None
    """postgresql://USER@HOST:PORT/DATABASE: leases and the durable copy of every context; null: one host (files,
    SQLite, flock). A password belongs in the environment (PGPASSWORD, or TASUKI__FLEET__STORE), never this file."""
    lease_s: float = 60.0
    """Seconds a task's lease lasts without a renewal (every heartbeat renews it), judged by the database's clock."""
    connect_timeout_s: float = 5.0
    """Seconds a connection to the store may take before the store counts as unreachable."""

    @field_validator("store")
    @classmethod
    def _a_postgresql_url(cls, value: str | None) -> str | None:
        if not value:  # unset or empty (compose's TASUKI__FLEET__STORE without the fleet profile): one host
            return None
        scheme = urlsplit(value).scheme
        if scheme not in STORE_SCHEMES:
            raise ValueError(f"must be a postgresql:// URL, not {scheme or 'no'} scheme")
        return value

    @field_validator("lease_s", "connect_timeout_s")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be greater than 0")
        return value
