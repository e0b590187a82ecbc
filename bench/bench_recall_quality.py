"""Recall quality on a labelled set from a real repository's history: hybrid vs BM25 alone vs vectors alone.

Each commit of ``tests/fixtures/memory/itsdangerous_history.jsonl`` (message and changed paths, from
pallets/itsdangerous) is an episode; each query of ``itsdangerous_queries.json`` names the commits it should
find. recall@5 = share of queries with a relevant commit among the first five. Three rankings over the same
store: BM25 + rerank (no embedder), vectors + rerank (no BM25 lists), and the full hybrid. The vectors are
the replay model's (hashed character trigrams and words): they know surface form, not meaning, so this
measures the pipeline, not an embedding model's grasp of paraphrase — run it with a real
``memory.embedding_model`` for that (``--model NAME --base-url URL``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from bench.common import Result
from memory import Episode
from memory.recall import BM25_K, KNN_K, fuse, queries, rerank
from memory.search import Embedder, embed_checked
from memory.sqlite import SQLiteMemoryStore
from replay.embeddings import embed_text

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "memory"
REPO = "github:pallets/itsdangerous"
K = 5


class HashEmbedder:
    """The replay model's vectors, in process."""

    model = "tasuki-replay-embed"

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [embed_text(t) for t in texts]


def load(store: SQLiteMemoryStore, embedder: Embedder) -> datetime:
    """Every commit as an episode with its vector; returns the newest commit's date (the benchmark's now)."""
    rows = [json.loads(line) for line in (FIXTURES / "itsdangerous_history.jsonl").read_text().splitlines()]
    episodes = [
        Episode(r["commit"], REPO, f"{REPO}#commit/{r['commit']}", datetime.fromisoformat(r["date"]), "completed",
                r["message"], files_changed=tuple(r["paths"]))
        for r in rows
    ]
    for start in range(0, len(episodes), 64):
        batch = episodes[start : start + 64]
        for e, vector in zip(batch, embed_checked(embedder, [e.text() for e in batch]), strict=True):
            store.add_episode(e, vector)
    return max(e.ended_at for e in episodes)


def ranked(store: SQLiteMemoryStore, embedder: Embedder, text: str, now: datetime, mode: str) -> list[str]:
    """The first K UUIDs of one method: ``bm25``, ``vector`` or ``hybrid`` (both lists fused)."""
    asked = queries(text, [])
    bm25 = [store.bm25(REPO, q, BM25_K) for q in asked] if mode != "vector" else []
    vectors = [store.knn(REPO, v, KNN_K) for v in embed_checked(embedder, asked)] if mode != "bm25" else []
    candidates = fuse(bm25, vectors)
    hits = rerank(text, candidates, store.fetch(REPO, list(candidates)), now, K)
    return [h.episode.uuid for h in hits]


def run(scratch: Path, *, quick: bool = False, embedder: Embedder | None = None) -> list[Result]:
    """recall@5 of each method, for keyword queries and for paraphrased ones."""
    embedder = embedder or HashEmbedder()
    scratch.mkdir(parents=True, exist_ok=True)
    store = SQLiteMemoryStore(scratch / "quality.db")
    now = load(store, embedder)
    labelled = json.loads((FIXTURES / "itsdangerous_queries.json").read_text())["queries"]
    results = []
    for kind in ("keyword", "paraphrase"):
        subset = [q for q in labelled if q["kind"] == kind]
        scores = {}
        for mode in ("bm25", "vector", "hybrid"):
            found = sum(bool(set(ranked(store, embedder, q["query"], now, mode)) & set(q["relevant"])) for q in subset)
            scores[mode] = found / len(subset)
        print(f"  {kind} ({len(subset)} queries): recall@5 bm25 {scores['bm25']:.2f}, vector {scores['vector']:.2f}, "
              f"hybrid {scores['hybrid']:.2f}", flush=True)
        met = scores["hybrid"] >= scores["bm25"] and scores["hybrid"] >= scores["vector"]
        results.append(Result(f"recall@5 {kind}: hybrid-max(others)",
                              f"{scores['hybrid'] - max(scores['bm25'], scores['vector']):+.2f}", ">= 0", met))
    store.close()
    return results


def main() -> None:
    """``python -m bench.bench_recall_quality [--model M --base-url URL]``."""
    import tempfile

    from bench.common import print_table

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the same run (the set is small)")
    parser.add_argument("--model", help="an embedding model on an OpenAI-compatible endpoint instead of the hash")
    parser.add_argument("--base-url", help="that endpoint's base URL (with /v1)")
    args = parser.parse_args()
    embedder = None
    if args.model:
        import os

        from worker.llm.embeddings import OpenAIEmbedder

        embedder = OpenAIEmbedder(args.model, base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY"),
                                  timeout_s=60)
    with tempfile.TemporaryDirectory(prefix="tasuki-bench-") as scratch:
        print_table(run(Path(scratch), quick=args.quick, embedder=embedder))


if __name__ == "__main__":
    main()
