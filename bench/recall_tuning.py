"""How recall's fusion was chosen (issue 38): a grid of fusion functions over the TUNING sets only.

``python -m bench.recall_tuning`` loads ``bench_recall_quality.TUNING`` (itsdangerous, markupsafe, jinja) — never the
held-out sets — with the local model's vectors, and prints recall@5 of the hybrid for each fusion: the convex
combination of max-normalized scores (issue 29's), of min-max-normalized scores, and reciprocal rank fusion with
several k and vector weights. Each candidate goes through the same rerank, thresholds and duplicates rule as
:func:`memory.search.recall`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.bench_recall_quality import TUNING, HashEmbedder, K, Labelled, default_embedder, found, load
from memory.recall import Q2_WEIGHT, Ranks, rerank
from memory.records import Match
from memory.sqlite import SQLiteMemoryStore

Normalizer = Callable[[Sequence[Match]], dict[str, float]]


def by_best(found: Sequence[Match]) -> dict[str, float]:
    """Each score over the list's best (issue 29's)."""
    best = max((m.score for m in found), default=0.0)
    return {m.uuid: max(m.score, 0.0) / best for m in found} if best > 0 else {}


def min_max(found: Sequence[Match]) -> dict[str, float]:
    """(score - worst) / (best - worst) over the list."""
    if not found:
        return {}
    low, high = min(m.score for m in found), max(m.score for m in found)
    return {m.uuid: (m.score - low) / (high - low) if high > low else 1.0 for m in found}


def z_score(found: Sequence[Match]) -> dict[str, float]:
    """(score - mean) / deviation over the list, shifted so the worst is 0."""
    if not found:
        return {}
    values = [m.score for m in found]
    mean = sum(values) / len(values)
    deviation = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5 or 1.0
    low = min(values)
    return {m.uuid: (m.score - low) / deviation for m in found}


def by_rank(k: int) -> Normalizer:
    """Reciprocal rank, 1 / (k + rank), scaled so the first is 1."""
    return lambda found: {m.uuid: (k + 1) / (k + position) for position, m in enumerate(found, start=1)}


def convex(normalize: Normalizer, alpha: float) -> Callable[[list[list[Match]], list[list[Match]]], dict[str, Ranks]]:
    """``alpha * vector + (1 - alpha) * bm25`` of the normalized lists (Q2 weighed as recall does)."""

    def fused(bm25_lists: list[list[Match]], vector_lists: list[list[Match]]) -> dict[str, Ranks]:
        def best(lists: list[list[Match]]) -> dict[str, float]:
            out: dict[str, float] = {}
            for index, listed in enumerate(lists):
                weight = 1.0 if index == 0 else Q2_WEIGHT
                for key, value in normalize(listed).items():
                    out[key] = max(out.get(key, 0.0), weight * value)
            return out

        bm25, vector = best(bm25_lists), best(vector_lists)
        a = alpha if any(bm25_lists) else 1.0
        scores = {key: a * vector.get(key, 0.0) + (1 - a) * bm25.get(key, 0.0) for key in bm25.keys() | vector}
        top = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:60]
        return {key: Ranks(score, None, None, bm25.get(key, 0.0), vector.get(key, 0.0)) for key, score in top}

    return fused


def recall_at_k(store: SQLiteMemoryStore, data: Labelled, fusion: Callable[..., dict[str, Ranks]], kind: str
                ) -> tuple[int, int]:
    """(queries whose top K holds a relevant commit, queries) for ``kind``."""
    hits = count = 0
    for q in data.queries:
        if q["kind"] != kind:
            continue
        text = str(q["query"])
        candidates = fusion(data.bm25[text], data.vectors[text])
        episodes = store.fetch(data.repository, list(candidates))
        ranked = [h.episode.uuid for h in rerank(text, candidates, episodes, data.now, K)]
        hits += bool(set(ranked) & set(q["relevant"]))  # type: ignore[call-overload]
        count += 1
    return hits, count


def main() -> None:
    """Print the grid (``--hash``: with the replay model's hash vectors, for their own weight)."""
    import sys

    embedder, which = default_embedder()
    if "--hash" in sys.argv[1:]:
        embedder, which = HashEmbedder(), "hash vectors of the replay model"
    print(f"vectors: {which}; sets: {', '.join(TUNING)} (tuning only)")
    grid: dict[str, Callable[..., dict[str, Ranks]]] = {}
    for alpha in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
        grid[f"convex by best, alpha {alpha}"] = convex(by_best, alpha)
        grid[f"convex min-max, alpha {alpha}"] = convex(min_max, alpha)
        grid[f"convex z-score, alpha {alpha}"] = convex(z_score, alpha)
    for k in (1, 5, 10, 20, 60):
        for alpha in (0.5, 0.6, 0.7, 0.8):
            grid[f"rrf k {k}, vector weight {alpha}"] = convex(by_rank(k), alpha)
    with tempfile.TemporaryDirectory(prefix="tasuki-tuning-") as scratch:
        loaded = []
        for name in TUNING:
            store = SQLiteMemoryStore(Path(scratch) / f"{name}.db")
            loaded.append((store, load(store, embedder, name)))
        print(f"{'fusion':40} {'keyword':>8} {'paraphrase':>11}  per set (paraphrase)")
        for mode in ("bm25", "vector", "hybrid"):  # recall as it is: BM25 alone, vectors alone, today's hybrid
            row = {kind: [(found(store, data, kind)[mode], sum(q["kind"] == kind for q in data.queries))
                          for store, data in loaded] for kind in ("keyword", "paraphrase")}
            total = {kind: sum(h for h, _ in rows) / sum(c for _, c in rows) for kind, rows in row.items()}
            per_set = " ".join(f"{h}/{c}" for h, c in row["paraphrase"])
            print(f"{'as recall runs it: ' + mode:40} {total['keyword']:8.2f} {total['paraphrase']:11.2f}  {per_set}")
        for label, fusion in grid.items():
            row = {kind: [recall_at_k(store, data, fusion, kind) for store, data in loaded]
                   for kind in ("keyword", "paraphrase")}
            total = {kind: sum(h for h, _ in rows) / sum(c for _, c in rows) for kind, rows in row.items()}
            per_set = " ".join(f"{h}/{c}" for h, c in row["paraphrase"])
            print(f"{label:40} {total['keyword']:8.2f} {total['paraphrase']:11.2f}  {per_set}", flush=True)
        for store, _ in loaded:
            store.close()


if __name__ == "__main__":
    main()
