"""LLM-free hybrid recall (SPEC §13, seed 002): two queries, KNN + BM25 each, RRF, heuristic rerank.

Pure functions: the store answers ranked lists, these fuse and rerank them; ``now`` is always passed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from memory.records import Episode

RECENT_MESSAGES = 6  # the last three exchanges make up Q2's context
KNN_K = 20
BM25_K = 20
RRF_K = 60
MAX_CANDIDATES = 60
NGRAM_N = 3
MAX_CHARS = 1200
RECENCY_TAU_DAYS = 45.0
DUPLICATE_DICE = 0.90
HIGH_THRESHOLD = 0.35  # the best hit must reach this, or nothing is recalled
MEDIUM_THRESHOLD = 0.28  # every further hit must reach this
W_RRF, W_LEX, W_REC = 0.55, 0.35, 0.10
SHORT_QUERY_NGRAMS = 30  # a query with fewer n-grams matches by chance: its lexical score is scaled down


@dataclass(frozen=True)
class Ranks:
    """Where one episode stood in the searches: best 1-based rank per method, and its fused RRF score."""

    rrf: float
    bm25_rank: int | None = None
    vector_rank: int | None = None


@dataclass(frozen=True)
class Hit:
    """One recalled episode with every figure that decided it (``tasuki memory search`` prints them)."""

    episode: Episode
    bm25_rank: int | None
    vector_rank: int | None
    rrf: float
    rrf_norm: float
    lexical: float
    recency: float
    score: float

    @property
    def reason(self) -> str:
        """002's machine-made reason line."""
        return (
            f"heuristic rerank: score={self.score:.3f} rrf={self.rrf_norm:.3f} "
            f"lex={self.lexical:.3f} rec={self.recency:.3f}"
        )


def queries(text: str, recent_messages: Sequence[str]) -> list[str]:
    """Q1 = the query text; Q2 = the last six messages, ``---``, Q1 (one query when they are equal)."""
    context = "\n".join(m for m in recent_messages[-RECENT_MESSAGES:] if m)
    q2 = f"{context}\n---\n{text}" if context else text
    return [text] if q2 == text else [text, q2]


def fuse(bm25_lists: Sequence[Sequence[str]], vector_lists: Sequence[Sequence[str]]) -> dict[str, Ranks]:
    """Reciprocal Rank Fusion (k = 60) of every ranked list, keeping each id's best rank per method;
    at most :data:`MAX_CANDIDATES`, best first."""
    scores: dict[str, float] = {}
    bm25: dict[str, int] = {}
    vector: dict[str, int] = {}
    for lists, best in ((bm25_lists, bm25), (vector_lists, vector)):
        for ranked in lists:
            for position, key in enumerate(ranked):
                scores[key] = scores.get(key, 0.0) + 1.0 / (RRF_K + position + 1)
                best[key] = min(best.get(key, position + 1), position + 1)
    top = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:MAX_CANDIDATES]
    return {key: Ranks(score, bm25.get(key), vector.get(key)) for key, score in top}


def char_ngrams(text: str, n: int = NGRAM_N, max_chars: int = MAX_CHARS) -> set[str]:
    """Character n-grams of the first ``max_chars`` of ``text``, lower-cased, whitespace collapsed."""
    clipped = " ".join(text.lower().split())[:max_chars]
    if len(clipped) <= n:
        return {clipped} if clipped else set()
    return {clipped[i : i + n] for i in range(len(clipped) - n + 1)}


def dice(a: set[str], b: set[str]) -> float:
    """Dice coefficient of two n-gram sets (0 when either is empty)."""
    if not a or not b:
        return 0.0
    return 2.0 * len(a & b) / (len(a) + len(b))


def lexical(query_ngrams: set[str], episode_ngrams: set[str]) -> float:
    """Dice similarity with 002's short-text correction (short queries count less)."""
    strength = min(1.0, len(query_ngrams) / SHORT_QUERY_NGRAMS)
    return dice(query_ngrams, episode_ngrams) * strength


def recency(ended_at: datetime, now: datetime) -> float:
    """``exp(-age_days / 45)``; an episode from the future counts as new."""
    age_days = max((now - ended_at).total_seconds(), 0.0) / 86400
    return math.exp(-age_days / RECENCY_TAU_DAYS)


def rerank(
    query: str, candidates: Mapping[str, Ranks], episodes: Mapping[str, Episode], now: datetime, limit: int
) -> list[Hit]:
    """Score ``0.55 rrf/max_rrf + 0.35 lexical + 0.10 recency``, apply the thresholds, drop near-duplicates,
    keep at most ``limit``. Candidates without an episode (forgotten meanwhile) are skipped."""
    present = {key: ranks for key, ranks in candidates.items() if key in episodes}
    if not present or limit <= 0:
        return []
    max_rrf = max(r.rrf for r in present.values())
    q = char_ngrams(query)
    scored: list[tuple[Hit, set[str]]] = []
    for key, ranks in present.items():
        episode = episodes[key]
        grams = char_ngrams(episode.text())
        rrf_norm = ranks.rrf / max_rrf
        lex = lexical(q, grams)
        rec = recency(episode.ended_at, now)
        score = W_RRF * rrf_norm + W_LEX * lex + W_REC * rec
        hit = Hit(episode, ranks.bm25_rank, ranks.vector_rank, ranks.rrf, rrf_norm, lex, rec, score)
        scored.append((hit, grams))
    scored.sort(key=lambda item: (-item[0].score, item[0].episode.uuid))
    return select(scored, limit)


def select(scored: Sequence[tuple[Hit, set[str]]], limit: int) -> list[Hit]:
    """002's injection rule over hits sorted best first: nothing unless the best reaches the high threshold,
    then further hits above the medium one that are not near-duplicates of one already taken."""
    if not scored or scored[0][0].score < HIGH_THRESHOLD:
        return []
    taken: list[tuple[Hit, set[str]]] = []
    for hit, grams in scored:
        if len(taken) >= limit:
            break
        if taken and hit.score < MEDIUM_THRESHOLD:
            break
        if any(dice(grams, other) >= DUPLICATE_DICE for _, other in taken):
            continue
        taken.append((hit, grams))
    return [hit for hit, _ in taken]


def rank_messages(
    query: str, records: Sequence[Mapping[str, object]], limit: int
) -> list[tuple[float, Mapping[str, object]]]:
    """A task's own messages best matching ``query`` by character n-gram Dice (a word found verbatim counts
    as a full match), best first; those with nothing in common are left out."""
    q = char_ngrams(query)
    needle = query.strip().lower()
    scored = []
    for record in records:
        content = str(record.get("content") or "")
        if not content:
            continue
        score = 1.0 if needle and needle in content.lower() else dice(q, char_ngrams(content, max_chars=4000))
        if score > 0.05:
            scored.append((score, record))
    scored.sort(key=lambda item: -item[0])
    return scored[:limit]
