"""002's recall: pure functions with a given ``now``, then the whole pipeline over a real store."""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path

import pytest

from memory.recall import (
    HIGH_THRESHOLD,
    MAX_CANDIDATES,
    MEDIUM_THRESHOLD,
    Q2_WEIGHT,
    VECTOR_WEIGHT,
    W_BM25_ONLY,
    W_FUSED,
    W_REC,
    Hit,
    Ranks,
    char_ngrams,
    dice,
    fuse,
    lexical,
    normalized,
    queries,
    reachable,
    recency,
    rerank,
    select,
)
from memory.records import Match
from memory.search import recall
from memory.sqlite import SQLiteMemoryStore
from replay.embeddings import embed_text
from tests.helpers.memory_support import NOW, BrokenEmbedder, HashEmbedder, episode

REPO = "github:acme/web"


@pytest.fixture
def store(tmp_path: Path) -> SQLiteMemoryStore:
    s = SQLiteMemoryStore(tmp_path / "memory.db")
    yield s
    s.close()


def test_two_queries_the_second_with_the_last_six_messages() -> None:
    recent = [f"m{i}" for i in range(8)]
    assert queries("fix login", recent) == ["fix login", "m2\nm3\nm4\nm5\nm6\nm7\n---\nfix login"]
    assert queries("fix login", []) == ["fix login"]


def test_each_lists_scores_are_divided_by_its_best_and_a_list_without_scores_counts_by_rank() -> None:
    assert normalized([Match("a", 4.0), Match("b", 2.0), Match("c", -1.0)]) == {"a": 1.0, "b": 0.5, "c": 0.0}
    assert normalized([Match("a", 0.0), Match("b", 0.0)]) == {"a": 1.0, "b": 0.5}  # BM25's common-word matches
    assert normalized([]) == {}


def test_fusion_is_a_convex_combination_of_normalized_scores() -> None:
    fused = fuse([[Match("a", 10.0), Match("b", 5.0)]], [[Match("b", 0.6), Match("c", 0.3)]], 0.8)
    assert fused["a"] == Ranks(pytest.approx(0.2), bm25_rank=1, vector_rank=None, bm25=1.0, vector=0.0)
    assert fused["b"] == Ranks(pytest.approx(0.8 + 0.2 * 0.5), bm25_rank=2, vector_rank=1, bm25=0.5, vector=1.0)
    assert fused["c"].fused == pytest.approx(0.8 * 0.5)
    assert list(fused) == ["b", "c", "a"]
    assert VECTOR_WEIGHT == 0.8


def test_q2_counts_half_and_each_method_keeps_its_best_rank() -> None:
    fused = fuse([], [[Match("a", 0.6)], [Match("b", 0.6), Match("a", 0.3)]])
    assert fused["a"] == Ranks(1.0, vector_rank=1, vector=1.0)
    assert fused["b"] == Ranks(Q2_WEIGHT, vector_rank=1, vector=Q2_WEIGHT)
    assert Q2_WEIGHT == 0.5


def test_bm25_alone_keeps_seed_002s_reciprocal_rank_fusion() -> None:
    fused = fuse([[Match("a", 9.0), Match("b", 1.0)], [Match("b", 5.0)]], [])
    best = 1 / 62 + 1 / 61
    assert fused["b"].fused == 1.0
    assert fused["a"].fused == pytest.approx((1 / 61) / best)
    assert (fused["b"].bm25_rank, fused["a"].bm25_rank) == (1, 1)


def test_one_method_alone_takes_the_whole_weight() -> None:
    assert fuse([], [[Match("a", 0.4)]])["a"].fused == 1.0
    assert fuse([[Match("a", 3.0)]], [[]])["a"].fused == 1.0  # an embedder, but no vector stored yet


def test_at_most_sixty_candidates() -> None:
    lists = [[Match(f"q{q}-{i}", 1.0 / (i + 1)) for i in range(20)] for q in range(4)]
    assert len(fuse(lists[:2], lists[2:])) == MAX_CANDIDATES == 60


def test_a_paraphrase_the_vectors_found_beats_a_chance_word_match_of_bm25() -> None:
    """Issue 29: RRF gave a BM25-only chance match the vectors' weight, and the n-gram overlap it shares with the
    query's words put it first; the paraphrase's own episode, found by the vectors alone, came second."""
    query = "the signing time should carry a time zone"
    meant = episode("meant", task="Use timezone-aware UTC datetimes for timestamps", days_ago=0)
    chance = episode("chance", task="the signing docs should carry a note on the time it takes", days_ago=0)
    candidates = fuse([[Match("chance", 3.0)]], [[Match("meant", 0.55), Match("chance", 0.2)]])
    hits = rerank(query, candidates, {"meant": meant, "chance": chance}, NOW, 5)
    assert hits[0].episode.uuid == "meant"


def test_character_trigram_dice_and_the_short_text_correction() -> None:
    assert char_ngrams("abcd") == {"abc", "bcd"}
    assert char_ngrams("ab") == {"ab"}
    assert dice({"a", "b"}, {"b", "c"}) == 0.5
    short = char_ngrams("hi there")  # 6 trigrams: counts 6/30 of its Dice
    assert lexical(short, short) == pytest.approx(6 / 30)
    long = char_ngrams("a query long enough to count fully in the lexical score")
    assert lexical(long, long) == 1.0
    assert char_ngrams("テストが失敗") == {"テスト", "ストが", "トが失", "が失敗"}


def test_recency_decays_with_tau_45_days_from_the_given_now() -> None:
    assert recency(NOW, NOW) == 1.0
    assert recency(NOW - timedelta(days=45), NOW) == pytest.approx(math.exp(-1))
    assert recency(NOW + timedelta(days=1), NOW) == 1.0


def test_rerank_with_vectors_is_the_fused_score_and_recency() -> None:
    query = "pytest fails in tests/test_auth.py with ImportError on the login module"
    best = episode("best", task=query, days_ago=0)
    other = episode("other", task="rename the docs folder and update mkdocs navigation", days_ago=45)
    candidates = {"best": Ranks(1.0, 1, 1, 1.0, 1.0), "other": Ranks(0.5, 2, None, 0.5, 0.0)}
    hits = rerank(query, candidates, {"best": best, "other": other}, NOW, 5)
    top, second = hits
    assert top.episode.uuid == "best"
    assert (top.fused, top.lexical, top.recency) == (1.0, 1.0, 1.0)
    assert top.score == pytest.approx(W_FUSED + W_REC)
    assert second.score == pytest.approx(W_FUSED * 0.5 + W_REC * math.exp(-1))  # its lexical overlap counts 0
    assert top.reason.startswith("fused rerank: score=1.000")


def test_rerank_with_bm25_alone_keeps_the_lexical_overlap() -> None:
    query = "pytest fails in tests/test_auth.py with ImportError on the login module"
    best = episode("best", task=query, days_ago=0)
    hits = rerank(query, {"best": Ranks(1.0, 1, None, 1.0)}, {"best": best}, NOW, 5, vectors=False)
    assert hits[0].score == pytest.approx(sum(W_BM25_ONLY))
    assert W_BM25_ONLY == (0.55, 0.35, 0.10)
    assert all(h.score >= MEDIUM_THRESHOLD for h in hits)


def scored(score: float, uuid: str, text: str) -> tuple[Hit, set[str]]:
    return Hit(episode(uuid, task=text), 1, None, 1.0, 0.0, 1.0, 0.0, 0.0, score), char_ngrams(text)


def test_nothing_is_recalled_when_the_best_is_below_the_high_threshold() -> None:
    assert select([scored(HIGH_THRESHOLD - 0.001, "a", "alpha beta")], 5) == []
    assert rerank("q", {}, {}, NOW, 5) == []


def test_further_hits_need_the_medium_threshold() -> None:
    hits = select([scored(0.36, "a", "alpha"), scored(0.29, "b", "beta"), scored(0.27, "c", "gamma")], 5)
    assert [h.episode.uuid for h in hits] == ["a", "b"]
    assert MEDIUM_THRESHOLD == 0.28


def test_near_duplicates_are_dropped_and_at_most_limit_returned() -> None:
    text = "pytest fails in tests/test_auth.py with ImportError on the login module, fixed the import"
    episodes = {f"d{i}": episode(f"d{i}", task=text, days_ago=i) for i in range(4)}
    episodes |= {f"x{i}": episode(f"x{i}", task=f"{text} variant {i} " + "other words " * i * 9) for i in range(1, 8)}
    candidates = {key: Ranks(1 / (1 + n), n + 1, None, 1 / (1 + n)) for n, key in enumerate(episodes)}
    hits = rerank(text, candidates, episodes, NOW, 3)
    assert len(hits) <= 3
    assert sum(h.episode.uuid.startswith("d") for h in hits) == 1


def test_only_candidates_that_could_reach_the_medium_threshold_are_fetched_and_the_hits_are_the_same() -> None:
    text = "pytest fails in tests/test_auth.py with ImportError on the login module"
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
             "lima"]
    episodes = {f"e{n}": episode(f"e{n}", task=f"{words[n]} " * 8, days_ago=n / 4) for n in range(12)}
    fused = [1.0, 0.9, 0.6, 0.45, 0.3, 0.25, 0.2, 0.19, 0.15, 0.1, 0.05, 0.0]  # a BM25-only match has at most 0.2
    candidates = {f"e{n}": Ranks(f, n + 1, None, f) for n, f in enumerate(fused)}
    kept = reachable(candidates)
    assert kept == ["e0", "e1", "e2", "e3", "e4", "e5", "e6"]  # 0.9 x 0.2 + 0.1 = 0.28: still reachable when new
    for limit in (3, 5, 12):
        everything = rerank(text, candidates, episodes, NOW, limit)
        assert len(everything) == min(limit, 6)  # e6 is a day and a half old: 0.277
        assert rerank(text, candidates, {key: episodes[key] for key in kept}, NOW, limit) == everything
    assert reachable(candidates, vectors=False) == list(candidates)  # BM25 alone: the lexical overlap counts


def fill(store: SQLiteMemoryStore) -> None:
    tasks = {
        "login": "Fix ImportError in auth/login.py: the login view imported a removed helper; pytest now passes",
        "docs": "Rewrite the README installation section for Windows users",
        "ci": "CI fails on Python 3.12 because distutils is gone; switched setup.py to setuptools",
        "cache": "Add an LRU cache to the avatar thumbnail service to cut S3 requests",
    }
    for n, (uuid, task) in enumerate(tasks.items()):
        e = episode(uuid, REPO, task=task, days_ago=n)
        store.add_episode(e, embed_text(e.meaning()))
    twin = episode("twin", "github:evil/web", task=tasks["login"], days_ago=0)  # a look-alike elsewhere
    store.add_episode(twin, embed_text(twin.meaning()))


def test_hybrid_recall_finds_the_episode_and_reports_every_figure(store: SQLiteMemoryStore) -> None:
    fill(store)
    result = recall(store, REPO, "ImportError in login.py", embedder=HashEmbedder(), now=NOW, limit=5)
    assert result.mode == "hybrid"
    assert result.note is None
    top = result.hits[0]
    assert top.episode.uuid == "login"
    assert top.bm25_rank == 1
    assert top.vector_rank is not None
    assert top.fused > 0
    assert top.vector > 0
    assert 0 < top.lexical <= 1
    assert 0 < top.recency <= 1
    assert all(h.episode.repository == REPO for h in result.hits)


def test_without_an_embedder_recall_is_bm25_and_says_so(store: SQLiteMemoryStore) -> None:
    fill(store)
    result = recall(store, REPO, "distutils Python 3.12", now=NOW)
    assert (result.mode, result.note) == ("bm25", "no embedding model configured: BM25 only")
    assert result.hits[0].episode.uuid == "ci"
    assert result.hits[0].vector_rank is None


def test_a_failing_embedder_falls_back_to_bm25(store: SQLiteMemoryStore) -> None:
    fill(store)
    result = recall(store, REPO, "distutils Python 3.12", embedder=BrokenEmbedder(), now=NOW)
    assert result.mode == "bm25"
    assert result.note is not None
    assert "timed out" in result.note
    assert result.hits[0].episode.uuid == "ci"


def test_wrong_dimension_from_the_embedder_falls_back_to_bm25(store: SQLiteMemoryStore) -> None:
    fill(store)
    result = recall(store, REPO, "distutils Python 3.12", embedder=HashEmbedder(dimensions=16), now=NOW)
    assert result.mode == "bm25"
    assert result.note is not None
    assert "16 dimensions" in result.note


def test_look_alike_content_of_another_repository_never_comes_back(store: SQLiteMemoryStore) -> None:
    fill(store)
    for text in ("ImportError in login.py", "login", "Fix ImportError in auth/login.py"):
        result = recall(store, "github:acme/web", text, embedder=HashEmbedder(), now=NOW, limit=5)
        assert "twin" not in {h.episode.uuid for h in result.hits}
    assert recall(store, "github:nobody/x", "login", embedder=HashEmbedder(), now=NOW).hits == []


def test_an_episode_is_embedded_without_its_file_list_and_searched_with_it() -> None:
    e = episode("e", task="Fix the login ImportError", files_changed=("src/auth/login.py", "tests/test_login.py"),
                failed_commands=({"command": "pytest -q", "error": "E ImportError"},), final_summary="fixed")
    assert "src/auth/login.py" in e.text()
    assert "src/auth/login.py" not in e.meaning()
    assert e.meaning() == "Fix the login ImportError\nfixed\n$ pytest -q\nE ImportError"
