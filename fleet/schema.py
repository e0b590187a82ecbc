"""The fleet store's tables, created and migrated by the store itself: versioned, idempotent, one migrator at a time.

Each entry of :data:`MIGRATIONS` is one version: its statements run in one transaction with the version's row in
``tasuki_schema``, under a transaction-level advisory lock, so hosts that start together migrate once. A database
migrated by a newer Tasuki is refused with one line, never written to.
"""

from __future__ import annotations

import psycopg

from fleet.errors import SchemaTooNew

# pg_advisory_xact_lock's key for "migrating": any constant of our own ("tasuki" in ASCII, as a bigint).
MIGRATION_LOCK = 0x746173756B69

VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS tasuki_schema (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: ownership leases and the durable copy of every context (SPEC §12).
    (
        """CREATE TABLE tasuki_leases (
            uuid       uuid PRIMARY KEY,
            epoch      bigint NOT NULL CHECK (epoch > 0),
            holder     text,
            expires_at timestamptz NOT NULL
        )""",
        """CREATE TABLE tasuki_contexts (
            uuid       uuid PRIMARY KEY,
            metadata   jsonb NOT NULL,
            state      jsonb NOT NULL,
            epoch      bigint NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now()
        )""",
        # One row per line of messages.jsonl, summaries.jsonl and tools.jsonl; `line` keeps the line's text as it
        # was written (json keeps it verbatim), so a rebuilt file is the original byte for byte.
        """CREATE TABLE tasuki_records (
            uuid  uuid NOT NULL REFERENCES tasuki_contexts (uuid) ON DELETE CASCADE,
            file  text NOT NULL CHECK (file IN ('messages.jsonl', 'summaries.jsonl', 'tools.jsonl')),
            id    bigint NOT NULL CHECK (id > 0),
            epoch bigint NOT NULL,
            line  json NOT NULL,
            PRIMARY KEY (uuid, file, id)
        )""",
    ),
)

LATEST = len(MIGRATIONS)


def schema_version(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    """The version the database is at (0: never migrated)."""
    conn.execute(VERSION_TABLE)
    row = conn.execute("SELECT coalesce(max(version), 0) FROM tasuki_schema").fetchone()
    return int(row[0]) if row else 0  # type: ignore[call-overload]


def migrate(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    """Bring the database to :data:`LATEST`; returns the version found before. Safe to run by every host at once."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        found = schema_version(conn)
        if found > LATEST:
            raise SchemaTooNew(
                f"the fleet store's schema is at version {found}, newer than this Tasuki's {LATEST}: upgrade Tasuki"
            )
        for version in range(found + 1, LATEST + 1):
            for statement in MIGRATIONS[version - 1]:
                conn.execute(statement)
            conn.execute("INSERT INTO tasuki_schema (version) VALUES (%s)", (version,))
    return found
