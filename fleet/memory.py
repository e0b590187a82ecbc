"""Memory on the fleet's PostgreSQL (SPEC §12, §13): :class:`memory.store.MemoryStore` with pgvector for vectors and
PostgreSQL's full-text index for the lexical side, so that no host writes SQLite on a shared disk.

Recall ranks the same on both stores: the full-text index (``tsvector``, GIN) finds the episodes that contain a
query's words, and the score is BM25 as SQLite's FTS5 computes it (k1 1.2, b 0.75, its idf floor), from the word
counts each episode keeps and the document frequencies kept as episodes come and go — PostgreSQL's own
``ts_rank`` has no idf. The words are those of the embedded store (``memory.sqlite.query_words``), as are the
rare-word rule and the common-word window. KNN scans the sign bits of a repository's newest vectors (Hamming
distance, PostgreSQL's own ``bit_count`` of an XOR: no pgvector release is needed for it) and re-ranks the nearest
by the cosine of their floats, as the SQLite store does. A search is one statement on an autocommit connection
(:meth:`fleet.store.FleetStore.reading`); BM25's episode count and average length are kept, not counted.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from contexts.masking import mask
from fleet.errors import FleetError
from fleet.lease import Conn
from fleet.store import FleetStore
from memory.errors import EmbeddingError, MemoryUnavailable
from memory.records import Episode, Match, Memory, RepositoryCount, StoreStatus
from memory.sqlite import (
    _WORD,
    COMMON_WINDOW,
    KNN_OVERSAMPLE,
    OVERSAMPLE_DIMENSIONS,
    RARE_DOCS,
    SHARD_SIZE,
    query_words,
)

K1, B = 1.2, 0.75  # FTS5's bm25() constants
IDF_FLOOR = 1e-6  # FTS5 clamps a non-positive idf (a word in most documents) to this


def words_of(text: str) -> list[str]:
    """Every word of ``text`` as the embedded store's tokenizer sees it (lower case, in order)."""
    return [w.lower() for w in _WORD.findall(text)]


# KNN scans a repository's newest KNN_SHARDS * KNN_SHARD vectors, as the SQLite store scans its two newest shards, and
# like it takes the KNN_OVERSAMPLE * k nearest by sign bits from each part of KNN_SHARD (the newest, the next): at
# 100,000 episodes the bench's recalls then agree with SQLite's in 25 of 30, against 18 with one top 160 over the
# window (and 2 with the exact cosine scan of the window: SQLite's KNN is approximate too).
KNN_SHARD, KNN_SHARDS = SHARD_SIZE, 2


def _vector(values: Sequence[float]) -> str:
    return "[" + ",".join(repr(float(v)) for v in values) + "]"


def _bits(values: Sequence[float]) -> str:
    """A vector's sign bits as a ``bit varying`` literal: 1 where the element is positive (binary quantization)."""
    return "".join("1" if v > 0 else "0" for v in values)


# BM25 in one statement (one round trip): the query's words with their document frequencies and the kept totals; the
# rare ones (at most RARE_DOCS episodes) ranked by FTS5's BM25 over the full-text index's matches; when there are none,
# the newest matches of the common words among the repository's COMMON_WINDOW newest episodes, scored 0. Words are
# letters and digits only (memory.sqlite.query_words), so a quoted word is never a tsquery operator.
BM25 = """
WITH found AS (
    SELECT t.term, t.docs::float8 AS docs, m.episodes::float8 AS episodes,
           m.lengths::float8 / greatest(m.episodes, 1) AS average
    FROM tasuki_memory_terms AS t CROSS JOIN tasuki_memory_totals AS m
    WHERE t.term = ANY(%(words)s) AND t.docs > 0),
rare AS (
    SELECT term, greatest(ln((episodes - docs + 0.5) / (docs + 0.5)), %(floor)s) AS idf, average
    FROM found WHERE docs <= %(rare)s),
ranked AS (
    SELECT e.uuid, e.id,
           sum(q.idf * (tf.n * %(k1)s + tf.n) / (tf.n + %(k1)s * (1 - %(b)s + %(b)s * (e.length + 1) / q.average)))
           AS score
    FROM tasuki_episodes AS e CROSS JOIN rare AS q CROSS JOIN LATERAL (SELECT (e.terms ->> q.term)::float8 AS n) AS tf
    WHERE e.repository = %(repository)s AND tf.n > 0
      AND e.words @@ (SELECT to_tsquery('simple', string_agg(quote_literal(term), ' | ')) FROM rare)
    GROUP BY e.uuid, e.id ORDER BY score DESC, e.id DESC LIMIT %(k)s),
common AS (
    SELECT uuid, id FROM (SELECT uuid, id, words FROM tasuki_episodes WHERE repository = %(repository)s
                          ORDER BY id DESC LIMIT %(window)s) AS newest
    WHERE NOT EXISTS (SELECT FROM rare)
      AND words @@ (SELECT to_tsquery('simple', string_agg(quote_literal(term), ' | ')) FROM found)
    ORDER BY id DESC LIMIT %(k)s)
SELECT uuid, score FROM (SELECT uuid, score, id FROM ranked UNION ALL SELECT uuid, 0, id FROM common) AS hits
ORDER BY score DESC, id DESC
"""


class PostgresMemoryStore:
    """Episodes, thread and repository memories in the fleet's PostgreSQL (schema versions 2 and 5)."""

    def __init__(self, store: FleetStore) -> None:
        self.store = store
        self._dimension: int | None = None  # once known it never changes: read once, not at every recall

    @contextmanager
    def _connection(self, *, reading: bool = False) -> Iterator[Conn]:
        """One transaction (``reading``: statements that each stand alone, no transaction around them); the fleet's
        store out of reach is :class:`MemoryUnavailable`, as a damaged SQLite file is: recall and recording go on
        without memory, never fail the task."""
        try:
            with self.store.reading() if reading else self.store.connection() as conn:
                yield conn
        except FleetError as exc:
            raise MemoryUnavailable(f"memory store: {exc}") from None

    # -- meta ------------------------------------------------------------------------------------

    def _meta(self, conn: Conn, key: str) -> str | None:
        row = conn.execute("SELECT value FROM tasuki_memory_meta WHERE key = %s", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _set_meta(self, conn: Conn, key: str, value: str | None) -> None:
        if value is None:
            conn.execute("DELETE FROM tasuki_memory_meta WHERE key = %s", (key,))
        else:
            conn.execute(
                "INSERT INTO tasuki_memory_meta (key, value) VALUES (%s, %s) "
                "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                (key, value),
            )

    def vector_dimension(self) -> int | None:
        """The dimension of the stored vectors (fixed by the first one), or None before any."""
        if self._dimension is None:
            with self._connection() as conn:
                value = self._meta(conn, "vector_dimension")
            self._dimension = int(value) if value else None
        return self._dimension

    # -- episodes --------------------------------------------------------------------------------

    def add_episode(self, episode: Episode, vector: Sequence[float] | None = None) -> None:
        """Record (or replace) an episode with its words and, when given, its vector: one transaction."""
        self.add_episodes([(episode, vector)])

    def add_episodes(self, batch: Sequence[tuple[Episode, Sequence[float] | None]]) -> None:
        """Record (or replace) many episodes, each with its vector or None, in one transaction (an import, a
        benchmark's fill): the rows in one statement, the word counts in one upsert."""
        if not batch:
            return
        rows = []
        counted: Counter[str] = Counter()
        bits: dict[str, str] = {}
        lengths = 0
        for episode, vector in batch:
            words = words_of(episode.text())
            counted.update(set(words))
            lengths += len(words) + 1
            if vector is not None:
                bits[episode.uuid] = _bits(vector)
            rows.append((
                episode.uuid, episode.repository, episode.thread, episode.ended_at,
                json.dumps(episode.to_json(), ensure_ascii=False), json.dumps(Counter(words)), len(words),
                " ".join(words), None if vector is None else _vector(vector),
            ))  # fmt: skip
        with self._connection() as conn:
            for dimension in sorted({len(vector) for _episode, vector in batch if vector is not None}):
                self._check_dimension(conn, dimension)
            _gone, replaced, episodes, length = self._remove(conn, "uuid = ANY(%s)", ([e.uuid for e, _v in batch],))
            with conn.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO tasuki_episodes (uuid, repository, thread, ended_at, data, terms, length, words, "
                    "embedding) VALUES (%s, %s, %s, %s, %s::jsonb, %s::jsonb, %s, to_tsvector('simple', %s), "
                    "%s::vector)",
                    rows,
                )
            if bits:
                conn.execute(
                    "INSERT INTO tasuki_episode_bits (id, repository, bits) SELECT e.id, e.repository, u.bits::varbit "
                    "FROM unnest(%s::text[], %s::text[]) AS u(uuid, bits) JOIN tasuki_episodes AS e USING (uuid)",
                    (list(bits), list(bits.values())),
                )
            counted.update(replaced)  # one upsert of the words, then the totals: every write locks them in one order
            self._count_docs(conn, counted)
            self._count_totals(conn, len(batch) + episodes, lengths + length)

    def _check_dimension(self, conn: Conn, dimension: int) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('tasuki_memory_dimension'))")
        known = self._meta(conn, "vector_dimension")
        if known is None:
            self._set_meta(conn, "vector_dimension", str(dimension))
        elif int(known) != dimension:
            raise EmbeddingError(f"embedding has {dimension} dimensions; the memory store holds {known}")

    def _count_docs(self, conn: Conn, changes: Counter[str]) -> None:
        """Add ``changes`` (term → documents gained or lost) to the document frequencies."""
        terms = sorted(term for term, change in changes.items() if change)  # one order: upserts never deadlock
        if terms:
            conn.execute(
                "INSERT INTO tasuki_memory_terms AS t (term, docs) "
                "SELECT w, d FROM unnest(%s::text[], %s::bigint[]) AS u(w, d) "
                "ON CONFLICT (term) DO UPDATE SET docs = t.docs + EXCLUDED.docs",
                (terms, [changes[term] for term in terms]),
            )

    def _count_totals(self, conn: Conn, episodes: int, lengths: int) -> None:
        """Add to the episode count and the total length (each episode's words + 1) that BM25's idf and average use."""
        if episodes:
            conn.execute(
                "UPDATE tasuki_memory_totals SET episodes = episodes + %s, lengths = lengths + %s", (episodes, lengths)
            )

    def _remove(self, conn: Conn, where: str, params: tuple[Any, ...]) -> tuple[list[str], Counter[str], int, int]:
        """Delete episodes (rows, words, vectors, sign bits): their UUIDs, and the changes to the document frequencies,
        the episode count and the total length, for the caller to apply."""
        gone = conn.execute(
            f"DELETE FROM tasuki_episodes WHERE {where} RETURNING uuid, terms, length",  # noqa: S608 - fixed clauses
            params,
        ).fetchall()
        lost: Counter[str] = Counter()
        for _uuid, terms, _length in gone:
            lost.update(dict.fromkeys(terms, -1))
        uuids = [str(uuid) for uuid, _terms, _length in gone]
        return uuids, lost, -len(gone), -sum(length + 1 for _uuid, _terms, length in gone)

    def _delete(self, conn: Conn, where: str, params: tuple[Any, ...]) -> list[str]:
        """Delete episodes and their document frequencies and totals; their UUIDs."""
        gone, lost, episodes, length = self._remove(conn, where, params)
        self._count_docs(conn, lost)
        self._count_totals(conn, episodes, length)
        return gone

    def episode(self, uuid: str) -> Episode | None:
        """One episode by UUID."""
        with self._connection(reading=True) as conn:
            row = conn.execute("SELECT data FROM tasuki_episodes WHERE uuid = %s", (uuid,)).fetchone()
        return None if row is None else Episode.from_json(row[0])

    def episodes(self, repository: str, limit: int = 100) -> list[Episode]:
        """A repository's episodes, newest first."""
        with self._connection() as conn:
            rows = conn.execute(
                "SELECT data FROM tasuki_episodes WHERE repository = %s ORDER BY ended_at DESC, id DESC LIMIT %s",
                (repository, limit),
            ).fetchall()
        return [Episode.from_json(row[0]) for row in rows]

    def vector(self, uuid: str) -> list[float] | None:
        """The episode's vector, or None."""
        with self._connection(reading=True) as conn:
            row = conn.execute("SELECT embedding::text FROM tasuki_episodes WHERE uuid = %s", (uuid,)).fetchone()
        return None if row is None or row[0] is None else [float(v) for v in json.loads(row[0])]

    def fetch(self, repository: str, uuids: Sequence[str]) -> dict[str, Episode]:
        """The episodes of ``uuids`` that belong to ``repository`` (never another repository's)."""
        if not uuids:
            return {}
        with self._connection(reading=True) as conn:
            rows = conn.execute(
                "SELECT uuid, data FROM tasuki_episodes WHERE uuid = ANY(%s) AND repository = %s",
                (list(uuids), repository),
            ).fetchall()
        return {str(uuid): Episode.from_json(data) for uuid, data in rows}

    # -- search ----------------------------------------------------------------------------------

    def bm25(self, repository: str, query: str, k: int) -> list[str]:
        """The UUIDs of :meth:`bm25_scored`."""
        return [match.uuid for match in self.bm25_scored(repository, query, k)]

    def bm25_scored(self, repository: str, query: str, k: int) -> list[Match]:
        """The repository's episodes best matching ``query`` by BM25 over its rare words, best first; else the newest
        matches of its common words, scored 0 (as the embedded store: see ``memory.sqlite.RARE_DOCS``)."""
        words = query_words(query)
        if not words:
            return []
        with self._connection(reading=True) as conn:
            rows = conn.execute(
                BM25,
                {
                    "words": words, "rare": RARE_DOCS, "floor": IDF_FLOOR, "k1": K1, "b": B, "repository": repository,
                    "window": COMMON_WINDOW, "k": k,
                },
            ).fetchall()  # fmt: skip
        return [Match(str(uuid), float(score)) for uuid, score in rows]

    def knn(self, repository: str, vector: Sequence[float], k: int) -> list[str]:
        """The UUIDs of :meth:`knn_scored`."""
        return [match.uuid for match in self.knn_scored(repository, vector, k)]

    def knn_scored(self, repository: str, vector: Sequence[float], k: int) -> list[Match]:
        """The repository's episodes nearest to ``vector`` by cosine (pgvector's ``<=>``), each with its similarity,
        among its ``KNN_SHARDS * KNN_SHARD`` newest vectors, as the SQLite store scans its two newest shards (older
        episodes are still found by BM25), so that a recall costs the same at 100,000 episodes as at 10,000. As
        there, the window's sign bits are scanned first (Hamming distance, 48 bytes a vector at 384 dimensions, from
        a narrow table), the nearest by bits of each part taken, and only those re-ranked by their float vectors:
        reading the window's floats cost 37 ms a query at 100,000 episodes (10,000 vectors of 1.5 KB out of TOAST)."""
        known = self.vector_dimension()
        if known is None:
            return []
        if len(vector) != known:
            raise EmbeddingError(f"query embedding has {len(vector)} dimensions; the memory store holds {known}")
        coarse = k * KNN_OVERSAMPLE * max(1, OVERSAMPLE_DIMENSIONS // known)
        with self._connection(reading=True) as conn:
            rows = conn.execute(
                "SELECT e.uuid, e.embedding <=> %(v)s::vector AS distance FROM generate_series(0, %(shards)s - 1) AS s"
                " CROSS JOIN LATERAL (SELECT id FROM (SELECT id, bits FROM tasuki_episode_bits WHERE repository = %(r)s"
                "  ORDER BY id DESC OFFSET s * %(shard)s LIMIT %(shard)s) AS part"
                "  ORDER BY bit_count(bits # %(b)s::varbit), id LIMIT %(coarse)s) AS near"
                " JOIN tasuki_episodes AS e USING (id) ORDER BY distance, e.id LIMIT %(k)s",
                {"v": _vector(vector), "b": _bits(vector), "r": repository, "shard": KNN_SHARD,
                 "shards": KNN_SHARDS, "coarse": coarse, "k": k},
            ).fetchall()  # fmt: skip
        return [Match(str(uuid), 1.0 - float(distance)) for uuid, distance in rows]

    # -- thread and repository memories ----------------------------------------------------------

    def memory(self, scope: str, key: str) -> Memory | None:
        """A thread or repository memory."""
        with self._connection() as conn:
            row = conn.execute(
                "SELECT text, updated_at, sources FROM tasuki_memories WHERE scope = %s AND key = %s", (scope, key)
            ).fetchone()
        if row is None:
            return None
        text, updated_at, sources = row
        return Memory(scope, key, str(text), updated_at.astimezone(UTC), tuple(sources))

    def thread_memories(self, repository: str) -> list[Memory]:
        """A repository's thread memories, newest first."""
        with self._connection() as conn:
            rows = conn.execute(
                "SELECT key, text, updated_at, sources FROM tasuki_memories WHERE scope = 'thread' "
                "AND repository = %s ORDER BY updated_at DESC",
                (repository,),
            ).fetchall()
        return [Memory("thread", str(k), str(t), at.astimezone(UTC), tuple(src)) for k, t, at, src in rows]

    def put_memory(self, memory: Memory, repository: str) -> None:
        """Replace a thread or repository memory."""
        with self._connection() as conn:
            conn.execute(
                "INSERT INTO tasuki_memories (scope, key, repository, text, updated_at, sources) "
                "VALUES (%s, %s, %s, %s, %s, %s::jsonb) ON CONFLICT (scope, key) DO UPDATE SET "
                "repository = EXCLUDED.repository, text = EXCLUDED.text, updated_at = EXCLUDED.updated_at, "
                "sources = EXCLUDED.sources",
                (
                    memory.scope,
                    memory.key,
                    repository,
                    memory.text,
                    memory.updated_at,
                    json.dumps(list(memory.sources)),
                ),
            )

    # -- listing, forgetting, pruning -----------------------------------------------------------

    def repositories(self) -> list[RepositoryCount]:
        """Repositories with episodes or memories, by name."""
        with self._connection() as conn:
            counts = {
                str(repo): (int(n), int(threads), last)
                for repo, n, threads, last in conn.execute(
                    "SELECT repository, count(*), count(DISTINCT thread), max(ended_at) FROM tasuki_episodes "
                    "GROUP BY repository"
                )
            }
            with_memory = {str(r[0]) for r in conn.execute("SELECT DISTINCT repository FROM tasuki_memories")}
        return [
            RepositoryCount(
                repo,
                counts.get(repo, (0, 0, None))[0],
                counts.get(repo, (0, 0, None))[1],
                repo in with_memory,
                counts[repo][2].astimezone(UTC) if repo in counts else None,
            )
            for repo in sorted(set(counts) | with_memory)
        ]

    def forget_episode(self, uuid: str) -> int:
        """Delete one episode."""
        with self._connection() as conn:
            return len(self._delete(conn, "uuid = %s", (uuid,)))

    def forget_thread(self, thread: str) -> int:
        """Delete a thread's episodes and its memory."""
        with self._connection() as conn:
            gone = self._delete(conn, "thread = %s", (thread,))
            conn.execute("DELETE FROM tasuki_memories WHERE scope = 'thread' AND key = %s", (thread,))
        return len(gone)

    def forget_repository(self, repository: str) -> int:
        """Delete a repository's episodes, thread memories and repository memory."""
        with self._connection() as conn:
            gone = self._delete(conn, "repository = %s", (repository,))
            conn.execute("DELETE FROM tasuki_memories WHERE repository = %s", (repository,))
        return len(gone)

    def prune(self, before: datetime, *, dry_run: bool = False) -> list[str]:
        """Episodes that ended before ``before``: listed, and deleted unless ``dry_run``."""
        with self._connection() as conn:
            if dry_run:
                rows = conn.execute("SELECT uuid FROM tasuki_episodes WHERE ended_at < %s", (before,)).fetchall()
                return [str(row[0]) for row in rows]
            return self._delete(conn, "ended_at < %s", (before,))

    # -- status ----------------------------------------------------------------------------------

    def note_problem(self, problem: str | None) -> None:
        """Remember the latest problem (None clears it)."""
        with self._connection() as conn:
            self._set_meta(conn, "last_error", problem)

    def status(self) -> StoreStatus:
        """Counts and the latest problem."""
        with self._connection() as conn:
            row = conn.execute(
                "SELECT count(*), count(DISTINCT repository), count(DISTINCT thread), count(embedding) "
                "FROM tasuki_episodes"
            ).fetchone()
            problem = self._meta(conn, "last_error")
            dimension = self._meta(conn, "vector_dimension")
        episodes, repositories, threads, vectors = row if row else (0, 0, 0, 0)
        return StoreStatus(
            mask(self.store.url), int(episodes), int(repositories), int(threads), int(vectors),
            int(dimension) if dimension else None, None, problem,
        )  # fmt: skip

    def close(self) -> None:
        """Nothing of its own to close: the fleet store's pool is shared (FleetStore.close closes it)."""
