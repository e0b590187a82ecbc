"""The embedded memory store: one SQLite database in WAL mode, FTS5 for BM25, sqlite-vec for vectors.

SQLite is used through ``apsw``: the interpreter's own ``sqlite3`` module may be built without extension
loading, which sqlite-vec needs.  Every write is one ``BEGIN IMMEDIATE`` transaction, so writers from
many processes queue on SQLite's lock (with a busy timeout) instead of failing or interleaving.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import apsw

from memory.errors import EmbeddingError, MemoryUnavailable
from memory.records import Episode, Match, Memory, RepositoryCount, StoreStatus

BUSY_TIMEOUT_MS = 10_000  # writers queue this long; a task gives up on memory after it
MAX_QUERY_TERMS = 64  # a long Q2 keeps its first distinct words; BM25 over hundreds of terms is slow
# BM25's cost is the length of the posting lists it walks (FTS5's bm25() counts every document of each
# phrase for its IDF). So only words in at most RARE_DOCS episodes are searched by BM25; commoner words add
# little to a ranking anyway. A query with no such word gets the newest COMMON_WINDOW episodes' matches,
# newest first. A search then costs about the same at 1,000 episodes as at 100,000. Document frequencies
# are kept in term_docs as episodes come and go (FTS5's own vocabulary table counts them by walking lists).
RARE_DOCS = 1000
COMMON_WINDOW = 2000
# sqlite-vec's KNN is an exact scan of a partition. A repository's vectors go into shards of SHARD_SIZE in the
# order they were recorded, and KNN searches its two newest shards: 5,000 to 10,000 episodes, whatever the
# repository's size (older episodes are still found by BM25).
SHARD_SIZE = 5000
# The scan reads each vector's sign bits (binary quantization: 384 floats are 48 bytes, compared by Hamming
# distance), keeps the KNN_OVERSAMPLE * k nearest by bits, and ranks those by the cosine of their full float
# vectors (episode_floats, read by row id for those rows only). sqlite-vec's exact float scan cost about 50 ms per
# query and shard pair at 384 dimensions on a loaded host; its cost of picking the k nearest grows with k, so
# the oversampling is kept modest (4 x k from each of the two shards: 0.97 of the exact top 20 and 0.998 of the
# exact top 5 over 10,000 docstrings embedded by all-MiniLM-L6-v2 in two shards; 2 x k from each, 0.92 and 0.99).
# Fewer dimensions are fewer bits that tell vectors apart: below
# OVERSAMPLE_DIMENSIONS the oversampling grows in proportion (64-dimension vectors: 6 times as many candidates).
KNN_OVERSAMPLE = 4
OVERSAMPLE_DIMENSIONS = 384
MAX_KNN = 4096  # sqlite-vec's largest k
# Reads through a memory map instead of a read() per page: a recall touches a few hundred pages (the shards'
# bit vectors, the candidates' float vectors and rows), and the copies and system calls were about a tenth of
# its CPU. Address space only; the pages are the OS's file cache, shared by every process that opens the store.
MMAP_BYTES = 1 << 30
_WORD = re.compile(r"[^\W_]+")

SCHEMA = """
CREATE TABLE IF NOT EXISTS episodes (
    id INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL UNIQUE,
    repository TEXT NOT NULL,
    thread TEXT NOT NULL,
    ended_at REAL NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS episodes_by_repository ON episodes (repository, ended_at);
CREATE INDEX IF NOT EXISTS episodes_by_repository_id ON episodes (repository, id);
CREATE INDEX IF NOT EXISTS episodes_by_thread ON episodes (thread);
CREATE INDEX IF NOT EXISTS episodes_by_age ON episodes (ended_at);
CREATE VIRTUAL TABLE IF NOT EXISTS episode_text USING fts5(scope, body, tokenize='unicode61');
CREATE TABLE IF NOT EXISTS term_docs (term TEXT PRIMARY KEY, docs INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS memories (
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    repository TEXT NOT NULL,
    text TEXT NOT NULL,
    updated_at REAL NOT NULL,
    sources TEXT NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE TABLE IF NOT EXISTS vector_counts (repository TEXT PRIMARY KEY, recorded INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


FLOATS_TABLE = "CREATE TABLE IF NOT EXISTS episode_floats (id INTEGER PRIMARY KEY, embedding BLOB NOT NULL)"


def scope_token(repository: str) -> str:
    """One FTS token standing for a repository, so a BM25 search is confined to it by the index itself."""
    return "r" + hashlib.sha256(repository.encode()).hexdigest()[:24]


def query_words(text: str) -> list[str]:
    """The distinct words of ``text`` as the tokenizer sees them (lower case), at most MAX_QUERY_TERMS."""
    return list(dict.fromkeys(w.lower() for w in _WORD.findall(text)))[:MAX_QUERY_TERMS]


def match_expression(repository: str, words: Sequence[str]) -> str | None:
    """An FTS5 query: the repository's token AND any of ``words`` (quoted, so none is an operator)."""
    if not words:
        return None
    return f"scope : {scope_token(repository)} AND (" + " OR ".join(f'"{w}"' for w in words) + ")"


def body_expression(words: Sequence[str]) -> str:
    """An FTS5 query: any of ``words`` in the body (quoted, so none is an operator)."""
    return "body : (" + " OR ".join(f'"{w}"' for w in words) + ")"


def shard_key(repository: str, ordinal: int) -> str:
    """The vector partition of a repository's ``ordinal``-th recorded vector."""
    return f"{scope_token(repository)}:{ordinal // SHARD_SIZE}"


def pack(vector: Sequence[float]) -> bytes:
    """A vector as sqlite-vec's float32 blob."""
    return struct.pack(f"{len(vector)}f", *vector)


def sign_bits(vector: Sequence[float]) -> bytes:
    """A vector's binary quantization as sqlite-vec's bit blob: bit i (least significant first in each byte)
    is set when element i is positive; padded with zero bits to whole bytes (bit columns need them)."""
    return sum(1 << i for i, x in enumerate(vector) if x > 0).to_bytes((len(vector) + 7) // 8, "little")


def bit_width(dimension: int) -> int:
    """The bit column's width for vectors of ``dimension`` floats (a multiple of 8)."""
    return (dimension + 7) // 8 * 8


def _time(moment: datetime) -> float:
    return moment.timestamp()


def _moment(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def create_private(path: Path) -> None:
    """Create the database file 0600 (its directory 0700 when new) before SQLite opens it; SQLite gives
    its -wal and -shm files the database file's permissions."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)


class SQLiteMemoryStore:
    """:class:`memory.store.MemoryStore` on one SQLite file (SPEC §13's embedded default)."""

    def __init__(self, path: Path, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        self.path = Path(path)
        self._dimension: int | None = None
        try:
            create_private(self.path)
            self._db = apsw.Connection(str(self.path))
            self._db.set_busy_timeout(busy_timeout_ms)
            self.vectors_available = self._load_vectors()
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(f"PRAGMA mmap_size={MMAP_BYTES}")
            with self._write():
                self._db.execute(SCHEMA)
                self._migrate_vectors()
                self._move_floats()
        except (apsw.Error, OSError) as exc:
            raise MemoryUnavailable(f"memory store {self.path}: {_describe(exc)}") from None

    def _load_vectors(self) -> bool:
        try:
            import sqlite_vec

            self._db.enable_load_extension(True)
            self._db.load_extension(sqlite_vec.loadable_path())
            self._db.enable_load_extension(False)
        except (ImportError, apsw.Error, AttributeError):
            return False
        return True

    @contextmanager
    def _write(self) -> Iterator[None]:
        """One immediate transaction: the write lock is taken first, so concurrent writers wait, not fail."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except apsw.Error as exc:
            raise MemoryUnavailable(f"memory store {self.path}: {_describe(exc)}") from None

    def _rows(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return list(self._db.execute(sql, params))
        except apsw.Error as exc:
            raise MemoryUnavailable(f"memory store {self.path}: {_describe(exc)}") from None

    # -- meta ------------------------------------------------------------------------------------

    def _meta(self, key: str) -> str | None:
        rows = self._rows("SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0][0]) if rows else None

    def _set_meta(self, key: str, value: str | None) -> None:
        if value is None:
            self._db.execute("DELETE FROM meta WHERE key = ?", (key,))
        else:
            self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def vector_dimension(self) -> int | None:
        """The dimension of the stored vectors (fixed by the first one), or None before any."""
        value = self._meta("vector_dimension")
        return int(value) if value else None

    def _known_dimension(self) -> int | None:
        """:meth:`vector_dimension` for a search, read once it is known (the first vector fixes it for good; until
        then, another process may write one, so it is read again)."""
        if self._dimension is None and self.vectors_available:
            self._dimension = self.vector_dimension()
        return self._dimension

    # -- episodes --------------------------------------------------------------------------------

    def add_episode(self, episode: Episode, vector: Sequence[float] | None = None) -> None:
        """Record (or replace) an episode with its full-text entry and, when given, its vector."""
        with self._write():
            if vector is not None:
                self._check_dimension(len(vector))
            self._delete_ids([row[0] for row in self._db.execute("SELECT id FROM episodes WHERE uuid = ?",
                                                                  (episode.uuid,))])
            self._db.execute(
                "INSERT INTO episodes (uuid, repository, thread, ended_at, data) VALUES (?, ?, ?, ?, ?)",
                (episode.uuid, episode.repository, episode.thread, _time(episode.ended_at),
                 json.dumps(episode.to_json(), ensure_ascii=False)),
            )
            rowid = self._db.last_insert_rowid()
            self._db.execute(
                "INSERT INTO episode_text (rowid, scope, body) VALUES (?, ?, ?)",
                (rowid, scope_token(episode.repository), episode.text()),
            )
            self._count_terms(episode.text(), +1)
            if vector is not None:
                self._insert_vector(rowid, shard_key(episode.repository, self._next_vector(episode.repository)),
                                    sign_bits(vector), pack(vector))

    def _create_vector_table(self, dimension: int) -> None:
        """The vector index (inside a write): sign bits scanned by sqlite-vec, float vectors in a table of their own
        for the re-rank (read by row id: a vec0 auxiliary column cost 0.3 ms more per query for its 160 rows)."""
        self._db.execute(
            "CREATE VIRTUAL TABLE IF NOT EXISTS episode_embeddings USING vec0("
            f"id INTEGER PRIMARY KEY, shard TEXT PARTITION KEY, bits BIT[{bit_width(int(dimension))}])"
        )
        self._db.execute(FLOATS_TABLE)

    def _insert_vector(self, rowid: int, shard: str, bits: bytes, floats: bytes) -> None:
        """One episode's vector: its sign bits in the index, its floats beside it (inside a write)."""
        self._db.execute("INSERT INTO episode_embeddings (id, shard, bits) VALUES (?, ?, vec_bit(?))",
                         (rowid, shard, bits))
        self._db.execute("INSERT INTO episode_floats (id, embedding) VALUES (?, ?)", (rowid, floats))

    def _move_floats(self) -> None:
        """A store made before episode_floats keeps each float vector in the index's auxiliary column: copy them
        into episode_floats and empty the column (inside a write, once)."""
        index = list(self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'episode_embeddings'"))
        moved = list(self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'episode_floats'"))
        if not index or moved or not self.vectors_available:
            return
        self._db.execute(FLOATS_TABLE)
        self._db.execute("INSERT INTO episode_floats (id, embedding) SELECT id, embedding FROM episode_embeddings")
        # Row by row: sqlite-vec 0.1.9 refuses an UPDATE over the whole table ("UPDATE on partition key columns").
        self._db.executemany("UPDATE episode_embeddings SET embedding = NULL WHERE id = ?",
                             list(self._db.execute("SELECT id FROM episode_floats")))

    def _migrate_vectors(self) -> None:
        """A store made before the quantized scan keeps its float vectors in episode_vectors: copy them (with
        their sign bits, in the same shards) into episode_embeddings and drop it (inside a write, once)."""
        old = list(self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'episode_vectors'"))
        if not old or not self.vectors_available:
            return
        dimension = self.vector_dimension()
        if dimension is not None:
            self._create_vector_table(dimension)
            for rowid, shard, blob in self._db.execute("SELECT id, shard, embedding FROM episode_vectors"):
                vector = struct.unpack(f"{len(blob) // 4}f", blob)
                self._insert_vector(rowid, shard, sign_bits(vector), bytes(blob))
        self._db.execute("DROP TABLE episode_vectors")

    def _check_dimension(self, dimension: int) -> None:
        """The first vector fixes the dimension (and creates the vector index); any other is refused."""
        if not self.vectors_available:
            raise EmbeddingError("sqlite-vec could not be loaded: vectors are not stored")
        known = self.vector_dimension()
        if known is None:
            self._create_vector_table(dimension)
            self._set_meta("vector_dimension", str(dimension))
        elif known != dimension:
            raise EmbeddingError(f"embedding has {dimension} dimensions; the memory store holds {known}")

    def _next_vector(self, repository: str) -> int:
        """The repository's count of recorded vectors before this one (inside a write); it never goes down."""
        self._db.execute(
            "INSERT INTO vector_counts (repository, recorded) VALUES (?, 1) "
            "ON CONFLICT (repository) DO UPDATE SET recorded = recorded + 1",
            (repository,),
        )
        rows = list(self._db.execute("SELECT recorded FROM vector_counts WHERE repository = ?", (repository,)))
        return int(rows[0][0]) - 1

    def _has_vectors(self) -> bool:
        return self.vectors_available and self.vector_dimension() is not None

    def _delete_ids(self, ids: Sequence[int]) -> None:
        """Delete episodes by row id: the row, its full-text entry, its vector (inside a write)."""
        vectors = self._has_vectors()
        for rowid in ids:
            for (body,) in self._db.execute("SELECT body FROM episode_text WHERE rowid = ?", (rowid,)):
                self._count_terms(str(body), -1)
            self._db.execute("DELETE FROM episode_text WHERE rowid = ?", (rowid,))
            if vectors:
                self._db.execute("DELETE FROM episode_embeddings WHERE id = ?", (rowid,))
                self._db.execute("DELETE FROM episode_floats WHERE id = ?", (rowid,))
            self._db.execute("DELETE FROM episodes WHERE id = ?", (rowid,))

    def episode(self, uuid: str) -> Episode | None:
        """One episode by UUID."""
        rows = self._rows("SELECT data FROM episodes WHERE uuid = ?", (uuid,))
        return Episode.from_json(json.loads(rows[0][0])) if rows else None

    def vector(self, uuid: str) -> list[float] | None:
        """The episode's float vector (the one its re-rank reads), or None."""
        if not self._has_vectors():
            return None
        rows = self._rows(
            "SELECT embedding FROM episode_floats WHERE id = (SELECT id FROM episodes WHERE uuid = ?)", (uuid,)
        )
        if not rows or rows[0][0] is None:
            return None
        blob = bytes(rows[0][0])
        return list(struct.unpack(f"{len(blob) // 4}f", blob))

    def episodes(self, repository: str, limit: int = 100) -> list[Episode]:
        """A repository's episodes, newest first."""
        rows = self._rows(
            "SELECT data FROM episodes WHERE repository = ? ORDER BY ended_at DESC, id DESC LIMIT ?",
            (repository, limit),
        )
        return [Episode.from_json(json.loads(row[0])) for row in rows]

    def fetch(self, repository: str, uuids: Sequence[str]) -> dict[str, Episode]:
        """The episodes of ``uuids`` that belong to ``repository`` (never another repository's)."""
        if not uuids:
            return {}
        marks = ",".join("?" * len(uuids))
        rows = self._rows(
            f"SELECT uuid, repository, data FROM episodes WHERE uuid IN ({marks})",  # noqa: S608 - only ?s
            tuple(uuids),
        )
        # Filtered here, not in SQL: the planner would walk the repository's index instead of the uuids'.
        return {uuid: Episode.from_json(json.loads(data)) for uuid, repo, data in rows if repo == repository}

    # -- search ----------------------------------------------------------------------------------

    def bm25(self, repository: str, query: str, k: int) -> list[str]:
        """The UUIDs of :meth:`bm25_scored`."""
        return [match.uuid for match in self.bm25_scored(repository, query, k)]

    def bm25_scored(self, repository: str, query: str, k: int) -> list[Match]:
        """The repository's episodes best matching ``query``, best first, with their BM25 scores (higher is
        better): BM25 over its rare words (the scope column weighs nothing), else the newest matches of its
        common words, each scored 0 (see RARE_DOCS)."""
        words = query_words(query)
        if not words:
            return []
        frequency = dict(self._rows(
            f"SELECT term, docs FROM term_docs WHERE term IN ({','.join('?' * len(words))})",  # noqa: S608
            words,
        ))
        rare = [w for w in words if 0 < frequency.get(w, 0) <= RARE_DOCS]
        if rare:
            # The repository's filter is a join, not its scope token in the MATCH: bm25() counts every document
            # of each phrase of the query, and the scope token is in every one of the repository's (26 ms per
            # query at 76,000 episodes). The rare words' matches are few by definition, the scores the same
            # (the scope column weighs nothing; document frequencies were always counted over all repositories).
            # CROSS JOIN keeps the full-text search outside: never a walk of the repository's episodes.
            sql = ("SELECT e.uuid, -bm25(episode_text, 0.0, 1.0) AS score FROM episode_text AS t "
                   "CROSS JOIN episodes AS e ON e.id = t.rowid WHERE episode_text MATCH ? AND e.repository = ? "
                   "ORDER BY score DESC, t.rowid DESC LIMIT ?")
            rows = self._rows(sql, (body_expression(rare), repository, k))
            return [Match(uuid, float(score)) for uuid, score in rows]
        common = [w for w in words if w in frequency]
        if not common:
            return []
        # The newest matches first, joined to their rows after the LIMIT (the scope token already confines them to
        # the repository; its rows are checked all the same).
        sql = ("SELECT e.uuid, e.repository FROM (SELECT rowid FROM episode_text WHERE episode_text MATCH ? "
               "AND rowid >= ? ORDER BY rowid DESC LIMIT ?) AS t CROSS JOIN episodes AS e ON e.id = t.rowid "
               "ORDER BY t.rowid DESC")
        rows = self._rows(sql, (match_expression(repository, common), self._window_start(repository), k))
        return [Match(uuid, 0.0) for uuid, repo in rows if repo == repository]

    def _count_terms(self, text: str, change: int) -> None:
        """Add ``change`` to the document frequency of each distinct word of ``text`` (inside a write)."""
        words = list(dict.fromkeys(w.lower() for w in _WORD.findall(text)))
        if change > 0:
            self._db.executemany(
                "INSERT INTO term_docs (term, docs) VALUES (?, 1) ON CONFLICT (term) DO UPDATE SET docs = docs + 1",
                [(w,) for w in words],
            )
        else:
            self._db.executemany("UPDATE term_docs SET docs = docs - 1 WHERE term = ?", [(w,) for w in words])

    def _window_start(self, repository: str) -> int:
        """The row id from which the repository's newest COMMON_WINDOW episodes start (0: it has fewer)."""
        rows = self._rows(
            "SELECT id FROM episodes WHERE repository = ? ORDER BY id DESC LIMIT 1 OFFSET ?",
            (repository, COMMON_WINDOW - 1),
        )
        return int(rows[0][0]) if rows else 0

    def knn(self, repository: str, vector: Sequence[float], k: int) -> list[str]:
        """The UUIDs of :meth:`knn_scored`."""
        return [match.uuid for match in self.knn_scored(repository, vector, k)]

    def knn_scored(self, repository: str, vector: Sequence[float], k: int) -> list[Match]:
        """Cosine KNN over the repository's two newest vector shards (see SHARD_SIZE), nearest first, each with
        its cosine similarity: the KNN_OVERSAMPLE * k nearest by sign bits, re-ranked by their float vectors."""
        known = self._known_dimension()
        if known is None:
            return []
        if len(vector) != known:
            raise EmbeddingError(f"query embedding has {len(vector)} dimensions; the memory store holds {known}")
        recorded = self._rows("SELECT recorded FROM vector_counts WHERE repository = ?", (repository,))
        if not recorded:
            return []
        newest = (int(recorded[0][0]) - 1) // SHARD_SIZE
        shards = [shard_key(repository, shard * SHARD_SIZE) for shard in range(newest, max(newest - 2, -1), -1)]
        coarse = min(k * KNN_OVERSAMPLE * max(1, OVERSAMPLE_DIMENSIONS // known), MAX_KNN)
        # One statement: SQLite runs the KNN once per shard of the IN list (the coarse nearest of each, as two
        # statements did), re-ranks their union by the float vectors (episode_floats, by row id) and joins the k
        # best to their UUIDs.
        marks = ",".join("?" * len(shards))
        sql = ("SELECT e.uuid, e.repository, n.distance FROM (SELECT v.id, "  # noqa: S608
               "vec_distance_cosine(f.embedding, ?) AS distance FROM (SELECT id FROM episode_embeddings "
               f"WHERE bits MATCH vec_bit(?) AND k = ? AND shard IN ({marks})) "
               "AS v CROSS JOIN episode_floats AS f ON f.id = v.id ORDER BY distance, v.id LIMIT ?) AS n "
               "CROSS JOIN episodes AS e ON e.id = n.id ORDER BY n.distance, n.id")
        rows = self._rows(sql, (pack(vector), sign_bits(vector), coarse, *shards, k))
        return [Match(uuid, 1.0 - float(distance)) for uuid, repo, distance in rows if repo == repository]

    # -- thread and repository memories ----------------------------------------------------------

    def memory(self, scope: str, key: str) -> Memory | None:
        """A thread or repository memory."""
        rows = self._rows(
            "SELECT text, updated_at, sources FROM memories WHERE scope = ? AND key = ?", (scope, key)
        )
        if not rows:
            return None
        text, updated_at, sources = rows[0]
        return Memory(scope, key, text, _moment(updated_at), tuple(json.loads(sources)))

    def thread_memories(self, repository: str) -> list[Memory]:
        """A repository's thread memories, newest first."""
        rows = self._rows(
            "SELECT key, text, updated_at, sources FROM memories WHERE scope = 'thread' AND repository = ? "
            "ORDER BY updated_at DESC",
            (repository,),
        )
        return [Memory("thread", key, text, _moment(at), tuple(json.loads(src))) for key, text, at, src in rows]

    def put_memory(self, memory: Memory, repository: str) -> None:
        """Replace a thread or repository memory."""
        with self._write():
            self._db.execute(
                "INSERT OR REPLACE INTO memories (scope, key, repository, text, updated_at, sources) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (memory.scope, memory.key, repository, memory.text, _time(memory.updated_at),
                 json.dumps(list(memory.sources))),
            )

    # -- listing, forgetting, pruning -----------------------------------------------------------

    def repositories(self) -> list[RepositoryCount]:
        """Repositories with episodes or memories, by name."""
        counts = {
            repo: (n, threads, last)
            for repo, n, threads, last in self._rows(
                "SELECT repository, COUNT(*), COUNT(DISTINCT thread), MAX(ended_at) FROM episodes GROUP BY repository"
            )
        }
        with_memory = {row[0] for row in self._rows("SELECT DISTINCT repository FROM memories")}
        return [
            RepositoryCount(
                repo,
                counts.get(repo, (0, 0, None))[0],
                counts.get(repo, (0, 0, None))[1],
                repo in with_memory,
                _moment(counts[repo][2]) if repo in counts else None,
            )
            for repo in sorted(set(counts) | with_memory)
        ]

    def forget_episode(self, uuid: str) -> int:
        """Delete one episode."""
        with self._write():
            ids = [row[0] for row in self._db.execute("SELECT id FROM episodes WHERE uuid = ?", (uuid,))]
            self._delete_ids(ids)
        return len(ids)

    def forget_thread(self, thread: str) -> int:
        """Delete a thread's episodes and its memory."""
        with self._write():
            ids = [row[0] for row in self._db.execute("SELECT id FROM episodes WHERE thread = ?", (thread,))]
            self._delete_ids(ids)
            self._db.execute("DELETE FROM memories WHERE scope = 'thread' AND key = ?", (thread,))
        return len(ids)

    def forget_repository(self, repository: str) -> int:
        """Delete a repository's episodes, thread memories and repository memory."""
        with self._write():
            ids = [row[0] for row in self._db.execute("SELECT id FROM episodes WHERE repository = ?", (repository,))]
            self._delete_ids(ids)
            self._db.execute("DELETE FROM memories WHERE repository = ?", (repository,))
            self._db.execute("DELETE FROM vector_counts WHERE repository = ?", (repository,))
        return len(ids)

    def prune(self, before: datetime, *, dry_run: bool = False) -> list[str]:
        """Episodes that ended before ``before``: listed, and deleted unless ``dry_run``."""
        if dry_run:
            return [row[0] for row in self._rows("SELECT uuid FROM episodes WHERE ended_at < ?", (_time(before),))]
        with self._write():
            rows = list(self._db.execute("SELECT id, uuid FROM episodes WHERE ended_at < ?", (_time(before),)))
            self._delete_ids([row[0] for row in rows])
        return [row[1] for row in rows]

    # -- status ----------------------------------------------------------------------------------

    def note_problem(self, problem: str | None) -> None:
        """Remember the latest problem (None clears it)."""
        with self._write():
            self._set_meta("last_error", problem)

    def status(self) -> StoreStatus:
        """Counts and the latest problem."""
        episodes, repositories, threads = self._rows(
            "SELECT COUNT(*), COUNT(DISTINCT repository), COUNT(DISTINCT thread) FROM episodes"
        )[0]
        vectors = self._rows("SELECT COUNT(*) FROM episode_embeddings")[0][0] if self._has_vectors() else 0
        problem = self._meta("last_error")
        if not self.vectors_available:
            problem = problem or "sqlite-vec could not be loaded: BM25 only"
        return StoreStatus(str(self.path), episodes, repositories, threads, vectors, self.vector_dimension(),
                           None, problem)

    def close(self) -> None:
        """Close the connection."""
        self._db.close()


def _describe(exc: BaseException) -> str:
    """One line for an operator: what SQLite said, in words."""
    if isinstance(exc, apsw.BusyError):
        return "database is locked by another process"
    if isinstance(exc, apsw.CorruptError | apsw.NotADBError):
        return f"database is damaged ({exc})"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
