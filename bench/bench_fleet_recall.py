"""Recall on the fleet's PostgreSQL against the embedded SQLite store, on the same 100,000 episodes (issue 27,
SPEC §12/§13): p95 of recall's whole pipeline (two queries, BM25 and KNN each, fusion, rerank; the queries embedded
by the hash in process, 384 dimensions) on each store, alternately. Both scan a bounded window of a repository's
newest vectors (SQLite its two newest shards, PostgreSQL its newest 10,000) and search rare words only, so both
should cost about the same at any size. Target: PostgreSQL at most 2 times SQLite.

The episodes are bench/bench_recall.py's (prose, code, file and function names that recur), with a second
repository of a tenth the size beside the first. PostgreSQL 16 with pgvector is the ``pgserver`` wheel's, started
in the scratch directory (tests/helpers/postgres.py).
"""

from __future__ import annotations

import random
import statistics
import time
from datetime import timedelta
from pathlib import Path

from bench.bench_recall import DIMENSIONS, NOW, OTHER, REPO, VECTOR_POOL, HashEmbedder, identifier, p95, unit_vector
from bench.common import Result, standalone, text_pool
from fleet.memory import PostgresMemoryStore
from fleet.store import FleetStore
from memory import Episode
from memory.search import recall
from memory.sqlite import SQLiteMemoryStore
from memory.store import MemoryStore
from tests.helpers.postgres import running_postgres

SIZE, QUICK_SIZE = 100_000, 2_000
ROUNDS, QUICK_ROUNDS = 60, 5
BATCH = 1000
TARGET = 2.0


def episodes(size: int) -> list[tuple[Episode, list[float]]]:
    """``size`` episodes of :data:`REPO` and a tenth as many of :data:`OTHER`, each with a 384-dimension vector."""
    texts = text_pool(400, 64, seed=size)
    rng = random.Random(size)
    directions = [unit_vector(rng) for _ in range(VECTOR_POOL)]
    made = []
    for n in range(size):
        for repository in (REPO, OTHER) if n % 10 == 0 else (REPO,):
            task = f"fix {identifier(rng, size)}: {rng.choice(texts)}"
            e = Episode(f"{repository[-3:]}-{n}", repository, f"{repository}#issue/{n % 500}",
                        NOW - timedelta(hours=n), "completed", task, final_summary=rng.choice(texts)[:200])  # fmt: skip
            made.append((e, rng.choice(directions)))
    made.reverse()  # oldest first, as tasks end: the newest are the last recorded
    return made


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Both stores filled with the same episodes, then recall timed on each, alternately."""
    size, rounds = (QUICK_SIZE, QUICK_ROUNDS) if quick else (SIZE, ROUNDS)
    scratch.mkdir(parents=True, exist_ok=True)
    made = episodes(size)
    with running_postgres() as server, FleetStore(server.dsn(server.create_database())) as fleet:
        stores: dict[str, MemoryStore] = {
            "sqlite": SQLiteMemoryStore(scratch / "memory.db"),
            "postgresql": PostgresMemoryStore(fleet),
        }
        started = time.perf_counter()
        for e, vector in made:
            stores["sqlite"].add_episode(e, vector)
        print(f"fleet recall: filled SQLite with {len(made):,} episodes in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        postgres = stores["postgresql"]
        assert isinstance(postgres, PostgresMemoryStore)
        for first in range(0, len(made), BATCH):
            postgres.add_episodes(made[first : first + BATCH])  # type: ignore[arg-type]
        print(f"fleet recall: filled PostgreSQL in {time.perf_counter() - started:.1f} s", flush=True)

        rng = random.Random(99)
        queries = [f"{identifier(rng, size)} {' '.join(t.split()[:6])}" for t in text_pool(120, rounds, seed=99)]
        embedder = HashEmbedder()
        samples: dict[str, list[float]] = {name: [] for name in stores}
        differ = 0
        for query in queries:
            hits = {}
            for name, store in stores.items():
                began = time.perf_counter()
                found = recall(store, REPO, query, recent_messages=[query[::-1]], embedder=embedder, now=NOW, limit=5)
                samples[name].append((time.perf_counter() - began) * 1000)
                hits[name] = [hit.episode.uuid for hit in found.hits]
            differ += hits["sqlite"] != hits["postgresql"]
        stores["sqlite"].close()
    sqlite_p95, postgres_p95 = p95(samples["sqlite"]), p95(samples["postgresql"])
    ratio = postgres_p95 / sqlite_p95
    print(
        f"fleet recall: p95 at {size:,} episodes ({DIMENSIONS} dimensions) {postgres_p95:.1f} ms on PostgreSQL vs "
        f"{sqlite_p95:.1f} ms on SQLite: {ratio:.2f} (p50 {statistics.median(samples['postgresql']):.1f} vs "
        f"{statistics.median(samples['sqlite']):.1f} ms)",
        flush=True,
    )
    print(f"fleet recall: recalls whose five hits differ between the stores: {differ} of {len(queries)}", flush=True)
    met = None if quick else ratio <= TARGET
    return [Result(f"fleet recall p95, PostgreSQL vs SQLite at {size:,}", f"{ratio:.2f}", f"<= {TARGET:g}", met)]


if __name__ == "__main__":
    standalone(run, __doc__)
