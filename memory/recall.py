"""LLM-free hybrid recall (SPEC §13, seed 002 as changed by issue 29): two queries, KNN + BM25 each, a convex
combination of normalized scores, a light rerank.

Seed 002 fused the lists by Reciprocal Rank Fusion and reranked ``0.55 rrf + 0.35 lexical + 0.10 recency``.
With a real embedding model that lost to vectors alone on paraphrased queries: RRF gives BM25's chance
matches the same weight as the vectors' best, and character n-gram overlap rewards the words a query shares
with a commit, which a paraphrase by definition does not. Bruch et al. (2022, "An Analysis of Fusion Functions
for Hybrid Retrieval") measured that a convex combination of normalized scores beats RRF and needs few labels
to tune; so here each list's scores are normalized (divided by the list's best: the theoretical minimum is 0
for both BM25 and the cosine similarities kept), combined ``alpha * vector + (1 - alpha) * bm25``, and the
lexical overlap only counts when there are no vectors (BM25 alone, which keeps seed 002's RRF and rerank). The
weights were chosen on the itsdangerous set and checked on the markupsafe set written before any tuning
(docs/memory-recall.md has the figures).

Pure functions: the store answers scored lists, these fuse and rerank them; ``now`` is always passed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from memory.records import Episode, Match

RECENT_MESSAGES = 6  # the last three exchanges make up Q2's context
KNN_K = 20
BM25_K = 20
MAX_CANDIDATES = 60
RRF_K = 60  # seed 002's fusion, kept for BM25 alone
NGRAM_N = 3
MAX_CHARS = 1200
RECENCY_TAU_DAYS = 45.0
DUPLICATE_DICE = 0.90
HIGH_THRESHOLD = 0.35  # the best hit must reach this, or nothing is recalled
MEDIUM_THRESHOLD = 0.28  # every further hit must reach this
VECTOR_WEIGHT = 0.8  # alpha, the vectors' share of the fused score, for a real embedding model (memory.vector_weight)
HASH_VECTOR_WEIGHT = 0.3  # alpha for the replay model's hashed trigrams: surface form, no meaning
Q2_WEIGHT = 0.5  # Q2 (recent messages + the query) counts half as much as the query itself: it may add noise
W_FUSED, W_REC = 0.9, 0.1  # the rerank with vectors: the fused score and recency
W_BM25_ONLY = (0.55, 0.35, 0.10)  # BM25 alone: fused score, lexical overlap, recency (seed 002's weights)
SHORT_QUERY_NGRAMS = 30  # a query with fewer n-grams matches by chance: its lexical score is scaled down


@dataclass(frozen=True)
class Ranks:
    """Where one episode stood in the searches: best 1-based rank per method, the best normalized score per
    method (0 when that method did not find it) and the fused score."""

    fused: float
    bm25_rank: int | None = None
    vector_rank: int | None = None
    bm25: float = 0.0
    vector: float = 0.0


@dataclass(frozen=True)
class Hit:
    """One recalled episode with every figure that decided it (``tasuki memory search`` prints them)."""

    episode: Episode
    bm25_rank: int | None
    vector_rank: int | None
    bm25: float
    vector: float
    fused: float
    lexical: float
    recency: float
    score: float

    @property
    def reason(self) -> str:
        """The machine-made reason line."""
        return (
            f"fused rerank: score={self.score:.3f} fused={self.fused:.3f} bm25={self.bm25:.3f} "
            f"vector={self.vector:.3f} lex={self.lexical:.3f} rec={self.recency:.3f}"
        )


def queries(text: str, recent_messages: Sequence[str]) -> list[str]:
    """Q1 = the query text; Q2 = the last six messages, ``---``, Q1 (one query when they are equal)."""
    context = "\n".join(m for m in recent_messages[-RECENT_MESSAGES:] if m)
    q2 = f"{context}\n---\n{text}" if context else text
    return [text] if q2 == text else [text, q2]


def normalized(found: Sequence[Match]) -> dict[str, float]:
    """Each UUID's score divided by the list's best (scores below 0 count as 0). A list without scores (BM25's
    newest matches of common words only) counts by rank: 1 / rank."""
    best = max((m.score for m in found), default=0.0)
    if best <= 0:
        return {m.uuid: 1.0 / position for position, m in enumerate(found, start=1)}
    return {m.uuid: max(m.score, 0.0) / best for m in found}


def _weighted(lists: Sequence[Sequence[Match]]) -> tuple[dict[str, float], dict[str, int]]:
    """Per UUID: the best ``query weight * normalized score`` over the lists (one per query) and best rank."""
    scores: dict[str, float] = {}
    ranks: dict[str, int] = {}
    for index, found in enumerate(lists):
        weight = 1.0 if index == 0 else Q2_WEIGHT
        for key, value in normalized(found).items():
            scores[key] = max(scores.get(key, 0.0), weight * value)
        for position, match in enumerate(found, start=1):
            ranks[match.uuid] = min(ranks.get(match.uuid, position), position)
    return scores, ranks


def fuse(bm25_lists: Sequence[Sequence[Match]], vector_lists: Sequence[Sequence[Match]],
         vector_weight: float = VECTOR_WEIGHT) -> dict[str, Ranks]:
    """The convex combination ``vector_weight * vector + (1 - vector_weight) * bm25`` of normalized scores (the
    vectors alone when BM25 found nothing); without vectors, seed 002's RRF of the BM25 lists. At most
    :data:`MAX_CANDIDATES`, best first."""
    bm25, bm25_ranks = _weighted(bm25_lists)
    vector, vector_ranks = _weighted(vector_lists)
    if any(vector_lists):
        alpha = vector_weight if any(bm25_lists) else 1.0
        fused = {key: alpha * vector.get(key, 0.0) + (1 - alpha) * bm25.get(key, 0.0) for key in bm25.keys() | vector}
    else:  # BM25 alone: seed 002's RRF, which leaves the order to the lexical rerank (0.33 vs 0.25 by scores)
        fused = _rrf(bm25_lists)
    top = sorted(fused.items(), key=lambda item: (-item[1], _first_rank(item[0], bm25_ranks, vector_ranks), item[0]))
    return {
        key: Ranks(score, bm25_ranks.get(key), vector_ranks.get(key), bm25.get(key, 0.0), vector.get(key, 0.0))
        for key, score in top[:MAX_CANDIDATES]
    }


def _rrf(lists: Sequence[Sequence[Match]]) -> dict[str, float]:
    """Seed 002's Reciprocal Rank Fusion (k = 60) of ``lists``, divided by the best."""
    scores: dict[str, float] = {}
    for found in lists:
        for position, match in enumerate(found, start=1):
            scores[match.uuid] = scores.get(match.uuid, 0.0) + 1.0 / (RRF_K + position)
    best = max(scores.values(), default=1.0)
    return {key: value / best for key, value in scores.items()}


def _first_rank(key: str, *ranks: Mapping[str, int]) -> int:
    """The best rank of ``key`` in any method (ties of the fused score keep the searches' order)."""
    return min((r[key] for r in ranks if key in r), default=1 << 30)


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
    query: str, candidates: Mapping[str, Ranks], episodes: Mapping[str, Episode], now: datetime, limit: int,
    *, vectors: bool = True,
) -> list[Hit]:
    """Score ``0.9 fused + 0.1 recency`` (``vectors``), or with BM25 alone seed 002's ``0.55 fused + 0.35
    lexical + 0.10 recency``; apply the thresholds, drop near-duplicates, keep at most ``limit``. Candidates
    without an episode (forgotten meanwhile) are skipped. With vectors the character n-grams (for the
    duplicates and the printed lexical figure) are made only for the hits :func:`select` looks at: the
    score does not need them, and making them for all 60 candidates was half of a recall's time."""
    present = {key: ranks for key, ranks in candidates.items() if key in episodes}
    if not present or limit <= 0:
        return []
    q = char_ngrams(query)

    def hit(key: str, grams: set[str], score: float | None = None) -> tuple[Hit, set[str]]:
        ranks, episode = present[key], episodes[key]
        lex = lexical(q, grams)
        rec = recency(episode.ended_at, now)
        if score is None:
            w_fused, w_lex, w_rec = W_BM25_ONLY
            score = w_fused * ranks.fused + w_lex * lex + w_rec * rec
        made = Hit(episode, ranks.bm25_rank, ranks.vector_rank, ranks.bm25, ranks.vector, ranks.fused, lex, rec,
                   score)
        return made, grams

    if vectors:
        ordered = sorted(
            ((W_FUSED * ranks.fused + W_REC * recency(episodes[key].ended_at, now), key) for key, ranks in
             present.items()),
            key=lambda item: (-item[0], episodes[item[1]].uuid),
        )
        return select((hit(key, char_ngrams(episodes[key].text()), score) for score, key in ordered), limit)
    scored = [hit(key, char_ngrams(episodes[key].text())) for key in present]
    scored.sort(key=lambda item: (-item[0].score, item[0].episode.uuid))
    return select(scored, limit)


def reachable(candidates: Mapping[str, Ranks], *, vectors: bool = True) -> list[str]:
    """The candidates :func:`rerank` could take, best first: with vectors a score is ``0.9 fused + 0.1 recency``
    and recency is at most 1, so one whose fused score leaves it below the medium threshold even when new is never
    taken (every hit taken is at or above it, and any below it ends the selection). Only these need their
    episodes fetched and decoded; BM25 alone (the lexical overlap counts there) needs them all."""
    if not vectors:
        return list(candidates)
    return [key for key, ranks in candidates.items() if W_FUSED * ranks.fused + W_REC >= MEDIUM_THRESHOLD]


def select(scored: Iterable[tuple[Hit, set[str]]], limit: int) -> list[Hit]:
    """002's injection rule over hits sorted best first (read lazily): nothing unless the best reaches the high
    threshold, then further hits above the medium one that are not near-duplicates of one already taken."""
    taken: list[tuple[Hit, set[str]]] = []
    for index, (hit, grams) in enumerate(scored):
        if index == 0 and hit.score < HIGH_THRESHOLD:
            return []
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
