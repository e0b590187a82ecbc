"""Recall latency against the size of one repository's memory: p95 at 10k and 100k episodes over p95 at 1k.

Each size is its own SQLite store (WAL, FTS5, sqlite-vec) filled with episodes of one repository, every one
with a 384-dimension unit vector (the local model's size, all-MiniLM-L6-v2; drawn at random from a pool of
4,096 random directions, as the scan costs the same whatever a vector holds, and hashing 200,000 texts or
drawing 77 million normal deviates would make the fill the slow part);
a second repository of the same size sits beside it, so the repository filter is part of what is timed.  One recall is
SPEC §13's whole pipeline as a task runs it (two queries, BM25 and KNN k = 20 each, score fusion, rerank) with
the embedding computed in process. When ``tasuki[embeddings]`` is installed, what the local model adds to a
recall (embedding the two queries on the CPU) is measured too and printed beside it.
Episode and query texts mix common prose and code with file and function names that recur in about 20
episodes each, as real tasks do; the sizes are timed alternately, round by round. The same queries are then
timed as Q1 alone, without recent messages: what a task's recall runs today (the worker passes none), for
information beside the two-query figure the targets hold.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.common import Result, standalone, text_pool
from memory import Episode
from memory.search import recall
from memory.sqlite import SQLiteMemoryStore
from replay.embeddings import embed_text

SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (100, 300, 1_000)
ROUNDS = 100  # p95 of 40 was the second slowest recall: one burst of load set it
QUICK_ROUNDS = 5
RATIO_TARGET = 2.0
ABSOLUTE_TARGET_MS = 50.0
REPO = "github:bench/one"
OTHER = "github:bench/two"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
DIMENSIONS = 384  # all-MiniLM-L6-v2's, the local model of tasuki[embeddings]
VECTOR_POOL = 4096


class HashEmbedder:
    """The replay model's vectors, without HTTP: what is timed is memory, not the model."""

    model = "bench"

    def embed(self, texts: list[str]) -> list[list[float]]:
        return [embed_text(t, DIMENSIONS) for t in texts]


def identifier(rng: random.Random, size: int) -> str:
    """A file and function name as tasks mention them; each one recurs in about 20 episodes at any size."""
    k = rng.randrange(max(size // 20, 1))
    return f"src/module{k % 97}/part{k}.py handle_part{k}"


def unit_vector(rng: random.Random) -> list[float]:
    """A random direction in :data:`DIMENSIONS` dimensions."""
    vector = [rng.gauss(0.0, 1.0) for _ in range(DIMENSIONS)]
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector]


def fill(path: Path, size: int) -> SQLiteMemoryStore:
    """A store with ``size`` episodes in each of two repositories: common prose and code, plus names."""
    store = SQLiteMemoryStore(path)
    texts = text_pool(400, 64, seed=size)
    rng = random.Random(size)
    directions = [unit_vector(rng) for _ in range(VECTOR_POOL)]
    for n in range(size):
        for repository in (REPO, OTHER):
            task = f"fix {identifier(rng, size)}: {rng.choice(texts)}"
            e = Episode(f"{repository[-3:]}-{n}", repository, f"{repository}#issue/{n % 500}",
                        NOW - timedelta(hours=n), "completed", task, final_summary=rng.choice(texts)[:200])
            store.add_episode(e, rng.choice(directions))
    return store


def p95(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=20)[-1] if len(samples) >= 2 else samples[0]


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Time recall at each size; ratios of p95 against the smallest size."""
    sizes, rounds = (QUICK_SIZES, QUICK_ROUNDS) if quick else (SIZES, ROUNDS)
    scratch.mkdir(parents=True, exist_ok=True)
    stores = {}
    for size in sizes:
        started = time.perf_counter()
        stores[size] = fill(scratch / f"memory-{size}.db", size)
        print(f"  filled {size:,} + {size:,} episodes in {time.perf_counter() - started:.1f}s", flush=True)
    rng = random.Random(99)
    queries = [f"{identifier(rng, sizes[0])} {' '.join(t.split()[:6])}" for t in text_pool(120, rounds, seed=99)]
    embedder = HashEmbedder()
    print(f"  timing at load average {os.getloadavg()[0]:.1f}", flush=True)
    samples = timed_recalls(stores, queries, embedder, recent=True)
    alone = timed_recalls(stores, queries, embedder, recent=False)
    print(f"  timing done at load average {os.getloadavg()[0]:.1f}", flush=True)
    # What a task itself pays for memory at its end: one episode written (the update runs on maintenance).
    writes: dict[int, list[float]] = {size: [] for size in sizes}
    for n in range(rounds):
        for size in sizes:
            e = Episode(f"end-{n}", REPO, f"{REPO}#issue/end", NOW, "completed", queries[n], final_summary=queries[n])
            started = time.perf_counter()
            stores[size].add_episode(e)
            writes[size].append((time.perf_counter() - started) * 1000)
    for store in stores.values():
        store.close()
    base = p95(samples[sizes[0]])
    results = []
    for size in sizes:
        print(f"  {size:>7,} episodes: p50 {statistics.median(samples[size]):.1f} ms, p95 {p95(samples[size]):.1f} ms; "
              f"Q1 alone (no recent messages, as a task recalls): p50 {statistics.median(alone[size]):.1f} ms, "
              f"p95 {p95(alone[size]):.1f} ms")
    for size in sizes[1:]:
        ratio = p95(samples[size]) / base
        results.append(Result(f"recall p95 {size:,}/{sizes[0]:,}", f"{ratio:.2f}", f"<= {RATIO_TARGET:g}",
                              None if quick else ratio <= RATIO_TARGET))
    for size in sizes:
        print(f"  {size:>7,} episodes: episode write at task end p50 {statistics.median(writes[size]):.1f} ms")
    results.append(Result(f"episode write at {sizes[-1]:,} (ms)", f"{statistics.median(writes[sizes[-1]]):.1f}",
                          "-", None))
    largest = p95(samples[sizes[-1]])
    results.append(Result(f"recall p95 at {sizes[-1]:,} (ms)", f"{largest:.1f}", f"<= {ABSOLUTE_TARGET_MS:g}",
                          None if quick else largest <= ABSOLUTE_TARGET_MS))
    results.append(Result(f"recall p95 at {sizes[-1]:,}, Q1 alone (ms)", f"{p95(alone[sizes[-1]]):.1f}", "-", None))
    if not quick:  # loading the model takes seconds: a quick run stays quick
        results += local_model_cost(queries)
    return results


def timed_recalls(stores: dict[int, SQLiteMemoryStore], queries: list[str], embedder: HashEmbedder, *,
                  recent: bool) -> dict[int, list[float]]:
    """Milliseconds of each recall per size, the sizes taking turns query by query; ``recent``: with a recent
    message, so Q2 is searched too (SPEC §13's two queries), else Q1 alone (what a task runs today: the worker
    passes no recent messages)."""
    samples: dict[int, list[float]] = {size: [] for size in stores}
    for query in queries:
        for size, store in stores.items():
            started = time.perf_counter()
            recall(store, REPO, query, recent_messages=[query[::-1]] if recent else [], embedder=embedder, now=NOW,
                   limit=5)
            samples[size].append((time.perf_counter() - started) * 1000)
    return samples


def local_model_cost(queries: list[str]) -> list[Result]:
    """p95 of embedding a recall's two queries with the local model, when tasuki[embeddings] is installed."""
    from worker.local_embeddings import LOCAL_MODEL, LocalEmbedder, local_available

    if not local_available():
        print("  local model: tasuki[embeddings] is not installed, not measured", flush=True)
        return []
    embedder = LocalEmbedder()
    embedder.embed(["warm up: the model loads once per worker process"])
    took = []
    for query in queries:
        started = time.perf_counter()
        embedder.embed([query, f"{query[::-1]}\n---\n{query}"])
        took.append((time.perf_counter() - started) * 1000)
    print(f"  {LOCAL_MODEL} on the CPU: the two queries of a recall embedded in p50 {statistics.median(took):.1f} ms, "
          f"p95 {p95(took):.1f} ms", flush=True)
    return [Result("local model: embedding a recall's queries, p95 (ms)", f"{p95(took):.1f}", "-", None)]


if __name__ == "__main__":
    standalone(run, __doc__)
