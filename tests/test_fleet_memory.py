"""Memory on the fleet's PostgreSQL (SPEC §12, §13; issue 27): the MemoryStore contract on pgvector and the full-text
index, and recall@5 equal to the SQLite store's on the same labelled data."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from bench.bench_recall_quality import SETS, HashEmbedder, load, scores
from fleet.memory import PostgresMemoryStore, words_of
from fleet.store import FleetStore
from memory import EmbeddingError, Memory, MemoryUnavailable
from memory.sqlite import SQLiteMemoryStore
from memory.store import MemoryStore
from replay.embeddings import embed_text
from tests.helpers.memory_support import NOW, episode
from tests.helpers.postgres import PostgresServer
from worker.settings import Settings
from worker.stores import kept_memory, open_memory


@pytest.fixture
def store(fleet_dsn: str) -> Iterator[PostgresMemoryStore]:
    with FleetStore(fleet_dsn) as fleet:
        yield PostgresMemoryStore(fleet)


def raw_counts(dsn: str) -> dict[str, int]:
    """The rows, vectors and counted words; checked on the way: the kept totals and sign bits agree with the rows."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*), count(embedding), coalesce(sum(length + 1), 0) FROM tasuki_episodes")
        episodes, vectors, lengths = row.fetchone() or (0, 0, 0)
        terms = conn.execute("SELECT count(*) FROM tasuki_memory_terms WHERE docs > 0").fetchone()
        kept = conn.execute("SELECT episodes, lengths FROM tasuki_memory_totals").fetchall()
        bits = conn.execute(
            "SELECT count(*) FROM tasuki_episode_bits AS b JOIN tasuki_episodes AS e USING (id) "
            "WHERE b.repository = e.repository AND length(b.bits) = vector_dims(e.embedding)"
        ).fetchone()
    assert terms is not None
    assert kept == [(episodes, lengths)]
    assert bits == (vectors,)
    return {"episodes": episodes, "vectors": vectors, "terms": terms[0]}


def test_it_is_a_memory_store(store: PostgresMemoryStore) -> None:
    typed: MemoryStore = store  # mypy checks the Protocol; this checks every method is there
    missing = [name for name in dir(MemoryStore) if not name.startswith("_") and not hasattr(typed, name)]
    assert missing == []


def test_episode_round_trips_with_every_field(store: PostgresMemoryStore) -> None:
    e = episode(
        "u1", task="Fix the login bug", final_summary="Fixed auth.py", latest_summary="read auth.py",
        files_changed=("auth.py",), failed_commands=({"command": "pytest", "error": "1 failed"},),
        result={"branch": "tasuki/1-u1", "pull_request": "https://x/pr/1"}, status="failed", error="boom",
    )  # fmt: skip
    store.add_episode(e, embed_text(e.text()))
    assert store.episode("u1") == e
    assert store.episodes("github:acme/web") == [e]


def test_recording_an_episode_twice_keeps_one_row_and_counts_its_words_once(
    store: PostgresMemoryStore, fleet_dsn: str
) -> None:
    e = episode("u1", task="Fix the login bug")
    store.add_episode(e, embed_text(e.text()))
    once = raw_counts(fleet_dsn)
    store.add_episode(e, embed_text(e.text()))
    assert raw_counts(fleet_dsn) == once == {"episodes": 1, "vectors": 1, "terms": 4}


def test_bm25_and_knn_never_cross_repositories(store: PostgresMemoryStore) -> None:
    mine = episode("a1", "github:acme/web", task="Fix flaky test_login in tests/test_auth.py")
    theirs = episode("b1", "github:other/web", task="Fix flaky test_login in tests/test_auth.py")
    for e in (mine, theirs):
        store.add_episode(e, embed_text(e.text()))
    assert store.bm25("github:acme/web", "flaky test_login", 20) == ["a1"]
    assert store.knn("github:acme/web", embed_text("flaky test_login"), 20) == ["a1"]
    assert store.fetch("github:acme/web", ["a1", "b1"]).keys() == {"a1"}
    assert store.bm25("github:nobody/web", "flaky", 20) == []


def test_query_words_are_never_full_text_operators(store: PostgresMemoryStore) -> None:
    store.add_episode(episode("a1", task='NOT a "quoted" AND (odd) query* NEAR it\'s a:b & c | !d <-> e'))
    assert store.bm25("github:acme/web", 'NOT "quoted" AND ( * NEAR - it\'s & | ! <-> :', 20) == ["a1"]
    assert store.bm25("github:acme/web", "!!! --- '' &|", 20) == []


def test_a_vector_of_another_dimension_is_refused_and_writes_nothing(store: PostgresMemoryStore) -> None:
    store.add_episode(episode("a1", task="first"), embed_text("first", 64))
    with pytest.raises(EmbeddingError, match="32 dimensions"):
        store.add_episode(episode("a2", task="second"), embed_text("second", 32))
    with pytest.raises(EmbeddingError):
        store.knn("github:acme/web", [1.0] * 32, 5)
    assert store.episode("a2") is None
    store.add_episode(episode("a2", task="second"))  # the recorder's fallback: without its vector
    assert store.episode("a2") is not None


def test_forget_episode_thread_and_repository_delete_rows_words_and_vectors(
    store: PostgresMemoryStore, fleet_dsn: str
) -> None:
    repo = "github:acme/web"
    for uuid, thread in (("e1", "t1"), ("e2", "t1"), ("e3", "t2"), ("e4", "t3")):
        e = episode(uuid, repo, task=f"task {uuid}", thread=f"{repo}#issue/{thread}")
        store.add_episode(e, embed_text(e.text()))
    store.add_episode(episode("o1", "github:other/x", task="other"), embed_text("other"))
    store.put_memory(Memory("thread", f"{repo}#issue/t1", "thread facts", NOW), repo)
    store.put_memory(Memory("repository", repo, "repo facts", NOW), repo)

    assert store.forget_episode("e4") == 1
    assert raw_counts(fleet_dsn)["episodes"] == 4
    assert store.forget_thread(f"{repo}#issue/t1") == 2
    assert store.memory("thread", f"{repo}#issue/t1") is None
    assert store.forget_repository(repo) == 1
    assert store.memory("repository", repo) is None
    assert raw_counts(fleet_dsn) == {"episodes": 1, "vectors": 1, "terms": 1}  # "other" alone is still counted
    assert store.bm25(repo, "task", 20) == []
    assert [r.repository for r in store.repositories()] == ["github:other/x"]


def test_prune_removes_only_episodes_older_than_the_cut(store: PostgresMemoryStore) -> None:
    store.add_episode(episode("old", task="old work", days_ago=91), embed_text("old"))
    store.add_episode(episode("new", task="new work", days_ago=89), embed_text("new"))
    cut = NOW - timedelta(days=90)
    assert store.prune(cut, dry_run=True) == ["old"]
    assert store.episode("old") is not None
    assert store.prune(cut) == ["old"]
    assert store.episode("old") is None
    assert [e.uuid for e in store.episodes("github:acme/web")] == ["new"]


def test_memories_and_status(store: PostgresMemoryStore) -> None:
    repo = "github:acme/web"
    store.put_memory(Memory("thread", f"{repo}#issue/1", "old", NOW - timedelta(days=1), ("u0",)), repo)
    store.put_memory(Memory("thread", f"{repo}#issue/1", "new", NOW, ("u0", "u1")), repo)
    assert store.memory("thread", f"{repo}#issue/1") == Memory("thread", f"{repo}#issue/1", "new", NOW, ("u0", "u1"))
    assert [m.text for m in store.thread_memories(repo)] == ["new"]
    store.add_episode(episode("u1", repo, task="x"), embed_text("x"))
    store.note_problem("embedding failed: timeout")
    status = store.status()
    assert (status.episodes, status.repositories, status.threads, status.vectors) == (1, 1, 1, 1)
    assert status.vector_dimension == 64
    assert status.last_error == "embedding failed: timeout"
    [listed] = store.repositories()
    assert (listed.repository, listed.episodes, listed.has_memory) == (repo, 1, True)


def test_bm25_scores_and_order_equal_the_sqlite_stores(store: PostgresMemoryStore, tmp_path: Path) -> None:
    sqlite = SQLiteMemoryStore(tmp_path / "memory.db")
    try:
        tasks = [
            "Fix the flaky login test in tests/test_auth.py",
            "Login page renders the wrong error after a timeout",
            "Speed up the token signer; the signer is slow on long payloads",
            "Document the serializer's salt and the signer's key derivation",
            "Timeout handling of the login retry loop",
        ]
        for n, task in enumerate(tasks):
            for target in (store, sqlite):
                target.add_episode(episode(f"e{n}", task=task, days_ago=10 - n))
        for query in ("login timeout", "signer salt", "flaky test_auth", "key derivation of the signer"):
            ours = store.bm25_scored("github:acme/web", query, 5)
            theirs = sqlite.bm25_scored("github:acme/web", query, 5)
            assert [m.uuid for m in ours] == [m.uuid for m in theirs], query
            assert [round(m.score, 6) for m in ours] == [round(m.score, 6) for m in theirs], query
    finally:
        sqlite.close()


@pytest.mark.parametrize("name", sorted(SETS))
def test_recall_at_5_equals_the_sqlite_stores_on_the_same_labelled_set(
    fleet_dsn: str, tmp_path: Path, name: str
) -> None:
    """bench/bench_recall_quality.py's sets and rankings, the same hash vectors, the two stores."""
    embedder = HashEmbedder()
    sqlite = SQLiteMemoryStore(tmp_path / "memory.db")
    with FleetStore(fleet_dsn) as fleet:
        postgres = PostgresMemoryStore(fleet)
        try:
            on_sqlite, on_postgres = load(sqlite, embedder, name), load(postgres, embedder, name)  # type: ignore[arg-type]
            for kind in ("keyword", "paraphrase"):
                expected = scores(sqlite, on_sqlite, kind)
                got = scores(postgres, on_postgres, kind)  # type: ignore[arg-type]
                assert got == expected, (name, kind)
        finally:
            sqlite.close()


def test_fleet_mode_keeps_memory_in_postgresql_and_one_host_in_sqlite(
    make_settings: Callable[..., Settings], fleet_dsn: str
) -> None:
    settings = make_settings({"TASUKI__FLEET__STORE": fleet_dsn})
    with kept_memory(settings) as kept:
        assert isinstance(kept, PostgresMemoryStore)
        kept.add_episode(episode("u1", task="Fix the login bug"))
    assert open_memory(settings, must_exist=True).bm25("github:acme/web", "login", 5) == ["u1"]
    assert not (Path(settings.contexts.base_dir).parent / "memory.db").exists()  # no SQLite file beside it
    one_host = open_memory(make_settings())
    assert isinstance(one_host, SQLiteMemoryStore)
    one_host.close()


def test_an_unreachable_fleet_store_is_memory_unavailable_so_tasks_go_on_without_memory(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(
        {"TASUKI__FLEET__STORE": "postgresql://tasuki:pw@127.0.0.1:1/tasuki", "TASUKI__FLEET__CONNECT_TIMEOUT_S": "1"}
    )
    store = open_memory(settings)
    with pytest.raises(MemoryUnavailable) as caught:
        store.bm25("github:acme/web", "login", 5)
    assert "unreachable" in str(caught.value)
    assert ":pw@" not in str(caught.value)


def test_fleet_import_copies_each_episodes_vector_and_the_fleet_finds_it_by_meaning(
    store: PostgresMemoryStore, tmp_path: Path
) -> None:
    from fleet.importer import ImportSummary, import_memory

    source = SQLiteMemoryStore(tmp_path / "memory.db")
    with_vector = episode("a1", task="Fix flaky test_login in tests/test_auth.py")
    without = episode("a2", task="Document the release process")
    source.add_episode(with_vector, embed_text(with_vector.text()))
    source.add_episode(without)
    assert source.vector("a2") is None
    assert source.vector("nobody") is None

    summary = ImportSummary()
    import_memory(source, store, summary, summary.problems.append)
    assert (summary.episodes, summary.problems) == (2, [])
    copied = store.vector("a1")
    assert copied == pytest.approx(embed_text(with_vector.text()), abs=1e-6)
    assert store.vector("a2") is None
    assert store.knn("github:acme/web", embed_text("flaky test_login"), 20) == ["a1"]
    source.close()


def test_knn_scans_only_the_repositorys_newest_vectors(
    store: PostgresMemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the SQLite store scans its two newest shards: the oldest episode, the query's exact match, is out of the
    window; another repository's newer episodes do not push it out."""
    import fleet.memory

    monkeypatch.setattr(fleet.memory, "KNN_SHARD", 2)  # two parts of 2: the newest 4
    texts = ["flaky test_login in tests/test_auth.py", "release notes", "docs build", "cache keys", "css colours"]
    for n, text in enumerate(texts):
        e = episode(f"a{n}", task=text, days_ago=10 - n)
        store.add_episode(e, embed_text(e.text()))
        other = episode(f"b{n}", "github:other/web", task=text, days_ago=10 - n)
        store.add_episode(other, embed_text(other.text()))
    found = store.knn("github:acme/web", embed_text(texts[0]), 5)
    assert sorted(found) == ["a1", "a2", "a3", "a4"]
    monkeypatch.setattr(fleet.memory, "KNN_SHARD", 5)
    assert store.knn("github:acme/web", embed_text(texts[0]), 5)[0] == "a0"


def test_a_batch_of_episodes_is_recorded_as_one_at_a_time_would_be(store: PostgresMemoryStore, fleet_dsn: str) -> None:
    batch = [
        episode("a1", task="Fix flaky test_login in tests/test_auth.py"),
        episode("a2", task="Fix the flaky cache keys", days_ago=2),
        episode("a3", task="Document the release process", days_ago=3),
    ]
    store.add_episodes([(e, embed_text(e.text()) if e.uuid != "a3" else None) for e in batch])
    together = (raw_counts(fleet_dsn), store.bm25_scored("github:acme/web", "flaky login", 5))
    assert together[0]["episodes"] == 3
    assert together[0]["vectors"] == 2
    store.add_episodes([(batch[0], embed_text(batch[0].text()))])  # replaced, not added again
    assert raw_counts(fleet_dsn) == together[0]

    store.forget_repository("github:acme/web")
    assert raw_counts(fleet_dsn) == {"episodes": 0, "vectors": 0, "terms": 0}
    for e in batch:
        store.add_episode(e, embed_text(e.text()) if e.uuid != "a3" else None)
    assert (raw_counts(fleet_dsn), store.bm25_scored("github:acme/web", "flaky login", 5)) == together


def test_a_store_made_before_the_sign_bits_is_migrated_and_recalls_as_a_new_one(
    fleet_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Schema 5 adds the sign bits and BM25's totals: a fleet database of schema 4 gets both from its rows, and then
    ranks as a store filled afresh does."""
    from fleet import schema

    monkeypatch.setattr(schema, "LATEST", 4)
    FleetStore(fleet_dsn).close()
    tasks = ["Fix flaky test_login in tests/test_auth.py", "Speed up the token signer", "Document the signer's salt"]
    with psycopg.connect(fleet_dsn) as conn:  # as schema 4's store wrote them
        for n, task in enumerate(tasks):
            e = episode(f"a{n}", task=task, days_ago=5 - n)
            words = words_of(e.text())
            conn.execute(
                "INSERT INTO tasuki_episodes (uuid, repository, thread, ended_at, data, terms, length, words, "
                "embedding) VALUES (%s, %s, %s, %s, %s::jsonb, %s::jsonb, %s, to_tsvector('simple', %s), %s::vector)",
                (e.uuid, e.repository, e.thread, e.ended_at, json.dumps(e.to_json()), json.dumps(Counter(words)),
                 len(words), " ".join(words), str(embed_text(e.text()))),
            )  # fmt: skip
        conn.execute(
            "INSERT INTO tasuki_memory_terms (term, docs) SELECT w, count(*) FROM tasuki_episodes, "
            "jsonb_object_keys(terms) AS w GROUP BY w"
        )
        conn.execute("INSERT INTO tasuki_memory_meta VALUES ('vector_dimension', '64')")
    monkeypatch.setattr(schema, "LATEST", len(schema.MIGRATIONS))
    with FleetStore(fleet_dsn) as fleet:
        migrated = PostgresMemoryStore(fleet)
        assert raw_counts(fleet_dsn)["vectors"] == 3  # with their sign bits, and the totals counted
        assert migrated.knn("github:acme/web", embed_text("flaky test_login"), 3)[0] == "a0"
        scored = migrated.bm25_scored("github:acme/web", "signer salt", 5)
        migrated.forget_repository("github:acme/web")
        for n, task in enumerate(tasks):
            e = episode(f"a{n}", task=task, days_ago=5 - n)
            migrated.add_episode(e, embed_text(e.text()))
        assert migrated.bm25_scored("github:acme/web", "signer salt", 5) == scored
        assert migrated.knn("github:acme/web", embed_text("flaky test_login"), 3)[0] == "a0"


def test_knn_re_ranks_the_nearest_by_sign_bits_by_their_floats(store: PostgresMemoryStore) -> None:
    """The sign bits only choose the candidates: the order and the similarities are the float vectors' cosines."""
    texts = ["flaky test_login in tests/test_auth.py", "release notes", "docs build", "cache keys", "flaky login"]
    for n, text in enumerate(texts):
        store.add_episode(episode(f"a{n}", task=text, days_ago=10 - n), embed_text(text))
    query = embed_text("flaky test_login")
    found = store.knn_scored("github:acme/web", query, 5)
    exact = sorted(
        (1 - sum(a * b for a, b in zip(query, embed_text(t), strict=True)) / math.hypot(*query) / math.hypot(
            *embed_text(t)), f"a{n}") for n, t in enumerate(texts)
    )  # fmt: skip
    assert [m.uuid for m in found] == [uuid for _distance, uuid in exact]
    assert [round(m.score, 5) for m in found] == [round(1 - distance, 5) for distance, _uuid in exact]


def test_a_read_skips_the_pools_check_only_on_a_connection_used_within_the_window(
    private_postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search on a connection used within CHECKED_RECENTLY_S is not checked first (one round trip fewer): after a
    restart inside that window the dropped connection fails one read (MemoryUnavailable: the task goes on without
    memory) and the pool replaces it; once the window has passed, the check finds it dropped and no read fails."""
    import fleet.store

    with FleetStore(private_postgres.dsn(private_postgres.create_database())) as shared:
        store = PostgresMemoryStore(shared)
        store.add_episode(episode("a1", task="Fix the login bug"), embed_text("login"))
        monkeypatch.setattr(fleet.store, "CHECKED_RECENTLY_S", 3600.0)
        assert store.bm25("github:acme/web", "login", 5) == ["a1"]
        private_postgres.restart()
        with pytest.raises(MemoryUnavailable):
            store.bm25("github:acme/web", "login", 5)
        assert store.bm25("github:acme/web", "login", 5) == ["a1"]

        monkeypatch.setattr(fleet.store, "CHECKED_RECENTLY_S", 0.0)  # every connection's last use is out of it
        private_postgres.restart()
        assert store.bm25("github:acme/web", "login", 5) == ["a1"]
        assert store.knn("github:acme/web", embed_text("login"), 5) == ["a1"]
