"""The fleet store's tables, created and migrated by the store itself: versioned, idempotent, one migrator at a time.

Each entry of :data:`MIGRATIONS` is one version: its statements run in one transaction with the version's row in
``tasuki_schema``, under a transaction-level advisory lock, so hosts that start together migrate once. A database
migrated by a newer Tasuki is refused with one line, never written to.
"""

from __future__ import annotations

from fleet.errors import SchemaTooNew
from fleet.lease import Conn

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
    # 2: memory (SPEC §13) on pgvector and the full-text index: fleet/memory.py.
    (
        "CREATE EXTENSION IF NOT EXISTS vector",
        """CREATE TABLE tasuki_episodes (
            id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            uuid       text NOT NULL UNIQUE,
            repository text NOT NULL,
            thread     text NOT NULL,
            ended_at   timestamptz NOT NULL,
            data       jsonb NOT NULL,
            terms      jsonb NOT NULL,
            length     integer NOT NULL,
            words      tsvector NOT NULL,
            embedding  vector
        )""",
        "CREATE INDEX tasuki_episodes_by_repository ON tasuki_episodes (repository, ended_at)",
        "CREATE INDEX tasuki_episodes_by_repository_id ON tasuki_episodes (repository, id)",
        "CREATE INDEX tasuki_episodes_by_thread ON tasuki_episodes (thread)",
        "CREATE INDEX tasuki_episodes_by_age ON tasuki_episodes (ended_at)",
        "CREATE INDEX tasuki_episodes_words ON tasuki_episodes USING gin (words)",
        "CREATE TABLE tasuki_memory_terms (term text PRIMARY KEY, docs integer NOT NULL)",
        """CREATE TABLE tasuki_memories (
            scope      text NOT NULL,
            key        text NOT NULL,
            repository text NOT NULL,
            text       text NOT NULL,
            updated_at timestamptz NOT NULL,
            sources    jsonb NOT NULL,
            PRIMARY KEY (scope, key)
        )""",
        "CREATE INDEX tasuki_memories_by_repository ON tasuki_memories (repository)",
        "CREATE TABLE tasuki_memory_meta (key text PRIMARY KEY, value text NOT NULL)",
    ),
    # 3: the context index of every host (fleet/index.py): contexts/index_schema.py's rows, the host that wrote
    # each, and the tallies a trigger keeps, so that counts and totals read a handful of rows at any size.
    (
        """CREATE TABLE tasuki_index (
            uuid         text PRIMARY KEY,
            host         text NOT NULL,
            location     text NOT NULL,
            status       text NOT NULL,
            created_at   double precision NOT NULL,
            ended_at     double precision,
            duration_us  bigint,
            task_source  text NOT NULL,
            repository   text NOT NULL,
            "user"       text,
            user_key     text NOT NULL,
            task_type    text NOT NULL,
            task_id      text NOT NULL,
            title        text,
            steps        bigint NOT NULL,
            tokens       bigint NOT NULL,
            messages     bigint NOT NULL,
            compressions bigint NOT NULL,
            disk_bytes   bigint NOT NULL,
            summary      text NOT NULL,
            cost_nusd    bigint NOT NULL,
            priced       integer NOT NULL
        )""",
        "CREATE INDEX tasuki_index_newest ON tasuki_index (created_at, uuid)",
        "CREATE INDEX tasuki_index_location ON tasuki_index (location, created_at, uuid)",
        "CREATE INDEX tasuki_index_status ON tasuki_index (status, created_at, uuid)",
        'CREATE INDEX tasuki_index_user ON tasuki_index ("user", created_at, uuid)',
        "CREATE INDEX tasuki_index_repository ON tasuki_index (repository, created_at, uuid)",
        "CREATE INDEX tasuki_index_ended ON tasuki_index (location, ended_at)",
        "CREATE INDEX tasuki_index_tally ON tasuki_index (location, status, user_key, created_at)",
        "CREATE INDEX tasuki_index_host ON tasuki_index (host, location)",
        """CREATE TABLE tasuki_index_damaged (
            uuid     text PRIMARY KEY,
            host     text NOT NULL,
            location text NOT NULL,
            reason   text NOT NULL
        )""",
        """CREATE TABLE tasuki_index_tallies (
            location     text NOT NULL,
            status       text NOT NULL,
            user_key     text NOT NULL,
            n            bigint NOT NULL,
            tokens       bigint NOT NULL,
            messages     bigint NOT NULL,
            compressions bigint NOT NULL,
            duration_us  bigint NOT NULL,
            durations    bigint NOT NULL,
            disk_bytes   bigint NOT NULL,
            newest       double precision NOT NULL,
            cost_nusd    bigint NOT NULL,
            priced       bigint NOT NULL,
            PRIMARY KEY (location, status, user_key)
        )""",
        """CREATE FUNCTION tasuki_index_tally() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP IN ('DELETE', 'UPDATE') THEN
                UPDATE tasuki_index_tallies AS t SET n = t.n - 1, tokens = t.tokens - OLD.tokens,
                    messages = t.messages - OLD.messages, compressions = t.compressions - OLD.compressions,
                    duration_us = t.duration_us - coalesce(OLD.duration_us, 0),
                    durations = t.durations - (OLD.duration_us IS NOT NULL)::int,
                    disk_bytes = t.disk_bytes - OLD.disk_bytes, cost_nusd = t.cost_nusd - OLD.cost_nusd,
                    priced = t.priced - OLD.priced,
                    newest = coalesce((SELECT max(c.created_at) FROM tasuki_index AS c
                        WHERE c.location = OLD.location AND c.status = OLD.status AND c.user_key = OLD.user_key), 0)
                WHERE t.location = OLD.location AND t.status = OLD.status AND t.user_key = OLD.user_key;
                DELETE FROM tasuki_index_tallies WHERE n <= 0;
            END IF;
            IF TG_OP IN ('INSERT', 'UPDATE') THEN
                INSERT INTO tasuki_index_tallies AS t VALUES (NEW.location, NEW.status, NEW.user_key, 1, NEW.tokens,
                    NEW.messages, NEW.compressions, coalesce(NEW.duration_us, 0), (NEW.duration_us IS NOT NULL)::int,
                    NEW.disk_bytes, NEW.created_at, NEW.cost_nusd, NEW.priced)
                ON CONFLICT (location, status, user_key) DO UPDATE SET n = t.n + 1, tokens = t.tokens + EXCLUDED.tokens,
                    messages = t.messages + EXCLUDED.messages,
                    compressions = t.compressions + EXCLUDED.compressions,
                    duration_us = t.duration_us + EXCLUDED.duration_us, durations = t.durations + EXCLUDED.durations,
                    disk_bytes = t.disk_bytes + EXCLUDED.disk_bytes, newest = greatest(t.newest, EXCLUDED.newest),
                    cost_nusd = t.cost_nusd + EXCLUDED.cost_nusd, priced = t.priced + EXCLUDED.priced;
            END IF;
            RETURN NULL;
        END $$""",
        """CREATE TRIGGER tasuki_index_tally AFTER INSERT OR UPDATE OR DELETE ON tasuki_index
            FOR EACH ROW EXECUTE FUNCTION tasuki_index_tally()""",
    ),
    # 4: the commit each task's holders put on its checkpoint branch last, recorded under the lease epoch in the same
    # transaction that held the lease through the push (fleet/durable.py's hold): what the next push is leased on.
    (
        """CREATE TABLE tasuki_checkpoints (
            uuid       uuid PRIMARY KEY,
            epoch      bigint NOT NULL,
            head       text NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT now()
        )""",
    ),
    # 5: recall at scale (fleet/memory.py). Each vector's sign bits in a narrow table of their own, which KNN scans
    # first (Hamming distance) before re-ranking the nearest by their floats, as the SQLite store does; and the
    # episode count and total length BM25 needs, kept as episodes come and go instead of counted per query.
    (
        """CREATE TABLE tasuki_episode_bits (
            id         bigint PRIMARY KEY REFERENCES tasuki_episodes (id) ON DELETE CASCADE,
            repository text NOT NULL,
            bits       bit varying NOT NULL
        )""",
        """INSERT INTO tasuki_episode_bits (id, repository, bits)
            SELECT id, repository, (SELECT string_agg(CASE WHEN x > 0 THEN '1' ELSE '0' END, '' ORDER BY n)
                                    FROM unnest(embedding::real[]) WITH ORDINALITY AS u(x, n))::varbit
            FROM tasuki_episodes WHERE embedding IS NOT NULL""",
        "CREATE INDEX tasuki_episode_bits_newest ON tasuki_episode_bits (repository, id)",
        """CREATE TABLE tasuki_memory_totals (
            one      boolean PRIMARY KEY DEFAULT true CHECK (one),
            episodes bigint NOT NULL,
            lengths  bigint NOT NULL
        )""",
        "INSERT INTO tasuki_memory_totals SELECT true, count(*), coalesce(sum(length + 1), 0) FROM tasuki_episodes",
    ),
    # 6: the requests each model call sent (requests.jsonl, issue 37) are lines of the durable copy too. NOT VALID:
    # the rows already there are the three files' (the old check held them), and a check of every row would hold the
    # table against every host's commits for as long as the scan takes.
    (
        "ALTER TABLE tasuki_records DROP CONSTRAINT tasuki_records_file_check",
        """ALTER TABLE tasuki_records ADD CONSTRAINT tasuki_records_file_check
            CHECK (file IN ('messages.jsonl', 'summaries.jsonl', 'tools.jsonl', 'requests.jsonl')) NOT VALID""",
    ),
    # 7: the audit log (issue 40, fleet/audit.py): contexts/audit.py's hash-chained lines as rows, one chain for the
    # fleet; the head row finds rows cut off the end, and a trigger refuses an UPDATE or DELETE by mistake (a hand
    # that disables it is still found by the chain).
    (
        """CREATE TABLE tasuki_audit (
            seq    bigint PRIMARY KEY CHECK (seq > 0),
            at     text NOT NULL,
            actor  text NOT NULL,
            action text NOT NULL,
            line   json NOT NULL
        )""",
        "CREATE INDEX tasuki_audit_at ON tasuki_audit (at, seq)",
        """CREATE TABLE tasuki_audit_head (
            one  boolean PRIMARY KEY DEFAULT true CHECK (one),
            seq  bigint NOT NULL,
            hash text NOT NULL
        )""",
        """CREATE FUNCTION tasuki_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'tasuki_audit is append-only';
        END $$""",
        """CREATE TRIGGER tasuki_audit_append_only BEFORE UPDATE OR DELETE ON tasuki_audit
            FOR EACH ROW EXECUTE FUNCTION tasuki_audit_append_only()""",
    ),
    # 8: personal API tokens (issue 40, fleet/api_tokens.py): contexts/api_tokens.py's rows, one set for the fleet so
    # a token made in one host's console works at every intake; the secret's SHA-256 only, found by its unique index.
    (
        """CREATE TABLE tasuki_api_tokens (
            id         text PRIMARY KEY,
            hash       text NOT NULL UNIQUE,
            owner      text NOT NULL,
            name       text NOT NULL,
            role       text NOT NULL,
            groups     json NOT NULL,
            created_at double precision NOT NULL,
            expires_at double precision NOT NULL,
            revoked_at double precision
        )""",
        "CREATE INDEX tasuki_api_tokens_owner ON tasuki_api_tokens (owner)",
    ),
)

LATEST = len(MIGRATIONS)


def schema_version(conn: Conn) -> int:
    """The version the database is at (0: never migrated)."""
    conn.execute(VERSION_TABLE)
    row = conn.execute("SELECT coalesce(max(version), 0) FROM tasuki_schema").fetchone()
    return int(row[0]) if row else 0


def migrate(conn: Conn) -> int:
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
