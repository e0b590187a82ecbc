"""The embedded memory store on real SQLite files: episodes, isolation, forgetting, pruning, bad files."""

from __future__ import annotations

import json
import stat
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import apsw
import pytest
import sqlite_vec

from memory import EmbeddingError, Memory, MemoryUnavailable, parse_repository, repository_key, thread_key
from memory.sqlite import SQLiteMemoryStore, pack, shard_key, sign_bits
from replay.embeddings import embed_text
from tests.helpers.memory_support import NOW, episode


@pytest.fixture
def store(tmp_path: Path) -> SQLiteMemoryStore:
    s = SQLiteMemoryStore(tmp_path / "var" / "memory.db")
    yield s
    s.close()


def vec_connection(path: Path) -> apsw.Connection:
    """The store's file opened past the store, with sqlite-vec loaded."""
    db = apsw.Connection(str(path))
    db.enable_load_extension(True)
    db.load_extension(sqlite_vec.loadable_path())
    return db


def older_store(path: Path, table: str, insert: Callable[[apsw.Connection, int, list[float]], None]) -> None:
    """Three episodes whose vectors are kept as a store made before the current layout kept them: the ``table``
    statement run, then ``insert`` writing each episode's 64-dimension vector."""
    store = SQLiteMemoryStore(path)
    for n, task in enumerate(("fix the flaky login test", "speed up the build cache", "login page typo")):
        store.add_episode(episode(f"e{n}", task=task))
    store.close()
    db = vec_connection(path)
    db.execute(table)
    for rowid, data in db.execute("SELECT id, data FROM episodes").fetchall():
        insert(db, rowid, embed_text(json.loads(data)["task"]))
    db.execute("INSERT INTO meta (key, value) VALUES ('vector_dimension', '64')")
    db.execute("INSERT INTO vector_counts (repository, recorded) VALUES ('github:acme/web', 3)")
    db.close()


def raw_counts(path: Path) -> dict[str, int]:
    """Rows of every table that holds an episode, read past the store."""
    db = vec_connection(path)
    tables = ["episodes", "episode_text"]
    for vectors in ("episode_embeddings", "episode_floats"):
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (vectors,)).fetchall():
            tables.append(vectors)
    counts = {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchall()[0][0] for t in tables}  # noqa: S608
    db.close()
    return counts


def test_episode_round_trips_with_every_field(store: SQLiteMemoryStore) -> None:
    e = episode(
        "u1", task="Fix the login bug", final_summary="Fixed auth.py", latest_summary="read auth.py",
        files_changed=("auth.py",), failed_commands=({"command": "pytest", "error": "1 failed"},),
        result={"branch": "tasuki/1-u1", "pull_request": "https://x/pr/1"}, status="failed", error="boom",
    )
    store.add_episode(e, embed_text(e.text()))
    assert store.episode("u1") == e
    assert store.episodes("github:acme/web") == [e]


def test_recording_an_episode_twice_keeps_one_row_one_text_one_vector(store: SQLiteMemoryStore) -> None:
    e = episode("u1", task="Fix the login bug")
    store.add_episode(e, embed_text(e.text()))
    store.add_episode(e, embed_text(e.text()))
    assert raw_counts(store.path) == {"episodes": 1, "episode_text": 1, "episode_embeddings": 1, "episode_floats": 1}


def test_files_are_private(store: SQLiteMemoryStore) -> None:
    store.add_episode(episode("u1", task="x"))
    files = [p for p in store.path.parent.iterdir() if p.name.startswith("memory.db")]
    assert {p.name for p in files} >= {"memory.db", "memory.db-wal"}
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o600}


def test_bm25_and_knn_never_cross_repositories(store: SQLiteMemoryStore) -> None:
    mine = episode("a1", "github:acme/web", task="Fix flaky test_login in tests/test_auth.py")
    theirs = episode("b1", "github:other/web", task="Fix flaky test_login in tests/test_auth.py")
    for e in (mine, theirs):
        store.add_episode(e, embed_text(e.text()))
    assert store.bm25("github:acme/web", "flaky test_login", 20) == ["a1"]
    assert store.knn("github:acme/web", embed_text("flaky test_login"), 20) == ["a1"]
    assert store.fetch("github:acme/web", ["a1", "b1"]).keys() == {"a1"}
    assert store.bm25("github:nobody/web", "flaky", 20) == []


def test_query_words_are_never_fts_operators(store: SQLiteMemoryStore) -> None:
    store.add_episode(episode("a1", task='NOT a "quoted" AND (odd) query* NEAR'))
    assert store.bm25("github:acme/web", 'NOT "quoted" AND ( * NEAR -', 20) == ["a1"]
    assert store.bm25("github:acme/web", "!!! ---", 20) == []


def test_a_vector_of_another_dimension_is_refused_and_writes_nothing(store: SQLiteMemoryStore) -> None:
    store.add_episode(episode("a1", task="first"), embed_text("first", 64))
    with pytest.raises(EmbeddingError, match="32 dimensions"):
        store.add_episode(episode("a2", task="second"), embed_text("second", 32))
    with pytest.raises(EmbeddingError):
        store.knn("github:acme/web", [1.0] * 32, 5)
    assert store.episode("a2") is None
    store.add_episode(episode("a2", task="second"))  # the recorder's fallback: without its vector
    assert store.episode("a2") is not None


def test_forget_episode_thread_and_repository_delete_rows_text_and_vectors(store: SQLiteMemoryStore) -> None:
    repo = "github:acme/web"
    for uuid, thread in (("e1", "t1"), ("e2", "t1"), ("e3", "t2"), ("e4", "t3")):
        e = episode(uuid, repo, task=f"task {uuid}", thread=f"{repo}#issue/{thread}")
        store.add_episode(e, embed_text(e.text()))
    store.add_episode(episode("o1", "github:other/x", task="other"), embed_text("other"))
    store.put_memory(Memory("thread", f"{repo}#issue/t1", "thread facts", NOW), repo)
    store.put_memory(Memory("repository", repo, "repo facts", NOW), repo)

    assert store.forget_episode("e4") == 1
    assert raw_counts(store.path) == {"episodes": 4, "episode_text": 4, "episode_embeddings": 4, "episode_floats": 4}
    assert store.forget_thread(f"{repo}#issue/t1") == 2
    assert store.memory("thread", f"{repo}#issue/t1") is None
    assert store.forget_repository(repo) == 1
    assert store.memory("repository", repo) is None
    assert raw_counts(store.path) == {"episodes": 1, "episode_text": 1, "episode_embeddings": 1, "episode_floats": 1}
    assert store.bm25(repo, "task", 20) == []
    assert [r.repository for r in store.repositories()] == ["github:other/x"]


def test_prune_removes_only_episodes_older_than_the_cut(store: SQLiteMemoryStore) -> None:
    store.add_episode(episode("old", task="old work", days_ago=91), embed_text("old"))
    store.add_episode(episode("new", task="new work", days_ago=89), embed_text("new"))
    cut = NOW - timedelta(days=90)
    assert store.prune(cut, dry_run=True) == ["old"]
    assert store.episode("old") is not None
    assert store.prune(cut) == ["old"]
    assert store.episode("old") is None
    assert raw_counts(store.path) == {"episodes": 1, "episode_text": 1, "episode_embeddings": 1, "episode_floats": 1}


def test_memories_and_status(store: SQLiteMemoryStore) -> None:
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


def test_a_damaged_file_is_memory_unavailable_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    path.write_bytes(b"this is not a database at all" * 200)
    with pytest.raises(MemoryUnavailable, match="damaged"):
        SQLiteMemoryStore(path)
    assert path.read_bytes().startswith(b"this is not")  # nothing was overwritten


def test_a_locked_database_is_memory_unavailable_after_the_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    SQLiteMemoryStore(path).close()
    holder = apsw.Connection(str(path))
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(MemoryUnavailable, match="locked by another process"):
            SQLiteMemoryStore(path, busy_timeout_ms=50)  # opening writes the schema: it waits, then gives up
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_repository_and_thread_names() -> None:
    key = {"task_source": "github", "owner": "acme", "repo": "web", "task_type": "issue", "task_id": "7"}
    assert repository_key(key) == "github:acme/web"
    assert thread_key(key, "github:acme/web") == "github:acme/web#issue/7"
    local = {"task_source": "local", "owner": "local", "repo": "demo", "task_type": "prompt", "task_id": "p1"}
    assert repository_key(local, "/srv/demo") == "/srv/demo"
    assert parse_repository("acme/web") == "github:acme/web"
    assert parse_repository("acme/web", "gitlab") == "gitlab:acme/web"
    assert parse_repository("/srv/demo") == "/srv/demo"


def test_knn_searches_the_newest_two_shards_and_bm25_still_finds_older_episodes(
    store: SQLiteMemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("memory.sqlite.SHARD_SIZE", 3)
    for n in range(10):  # shards 0-2, 3-5, 6-8, 9: the newest two hold episodes 6 to 9
        e = episode(f"e{n}", task=f"unique{n} shared words")
        store.add_episode(e, embed_text(e.text()))
    near = store.knn("github:acme/web", embed_text("shared words"), 20)
    assert sorted(near) == ["e6", "e7", "e8", "e9"]
    assert store.bm25("github:acme/web", "unique0", 20) == ["e0"]


def test_a_store_with_float_vectors_is_moved_to_the_quantized_index_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    # The layout of stores made before the quantized scan: one float32 vec0 table, episode_vectors.
    older_store(
        path,
        "CREATE VIRTUAL TABLE episode_vectors USING vec0(id INTEGER PRIMARY KEY, shard TEXT PARTITION KEY, "
        "embedding FLOAT[64] distance_metric=cosine)",
        lambda db, rowid, vector: db.execute("INSERT INTO episode_vectors (id, shard, embedding) VALUES (?, ?, ?)",
                                             (rowid, shard_key("github:acme/web", 0), pack(vector))),
    )

    store = SQLiteMemoryStore(path)
    assert store.knn("github:acme/web", embed_text("fix the flaky login test"), 20)[0] == "e0"
    assert store.status().vectors == 3
    store.close()
    assert raw_counts(path) == {"episodes": 3, "episode_text": 3, "episode_embeddings": 3, "episode_floats": 3}
    db = apsw.Connection(str(path))
    assert db.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'episode_vectors'").fetchall() == [(0,)]
    db.close()


def test_a_store_with_float_vectors_in_the_index_moves_them_to_their_own_table_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    # The layout of stores made before episode_floats: the float vectors in the vec0 index's auxiliary column.
    older_store(
        path,
        "CREATE VIRTUAL TABLE episode_embeddings USING vec0(id INTEGER PRIMARY KEY, shard TEXT PARTITION KEY, "
        "bits BIT[64], +embedding BLOB)",
        lambda db, rowid, vector: db.execute(
            "INSERT INTO episode_embeddings (id, shard, bits, embedding) VALUES (?, ?, vec_bit(?), ?)",
            (rowid, shard_key("github:acme/web", 0), sign_bits(vector), pack(vector))),
    )

    store = SQLiteMemoryStore(path)
    found = store.knn_scored("github:acme/web", embed_text("fix the flaky login test"), 20)
    assert found[0].uuid == "e0"
    assert found[0].score == pytest.approx(1.0, abs=1e-5)
    assert store.vector("e1") == pytest.approx(embed_text("speed up the build cache"), abs=1e-6)  # fleet import's
    store.close()
    assert raw_counts(path) == {"episodes": 3, "episode_text": 3, "episode_embeddings": 3, "episode_floats": 3}
    db = vec_connection(path)
    assert db.execute("SELECT COUNT(*) FROM episode_embeddings WHERE embedding IS NOT NULL").fetchall() == [(0,)]
    db.close()


def test_the_quantized_scan_finds_the_exact_nearest_of_its_candidates(store: SQLiteMemoryStore) -> None:
    texts = [f"task {n}: {word} of the parser" for n, word in enumerate(
        ["rewrite the tokenizer", "fix a crash", "document the grammar", "speed up lexing", "handle unicode",
         "drop python 3.8", "add a cli flag", "test error messages", "remove dead code", "cache the tables"])]
    for n, text in enumerate(texts):
        store.add_episode(episode(f"e{n}", task=text), embed_text(text, 384))
    query = embed_text("handle unicode in the parser", 384)
    found = store.knn_scored("github:acme/web", query, 3)
    exact = sorted(range(len(texts)), key=lambda n: -sum(a * b for a, b in zip(query, embed_text(texts[n], 384),
                                                                                 strict=True)))
    assert [m.uuid for m in found] == [f"e{n}" for n in exact[:3]]
    assert found[0].score == pytest.approx(sum(a * b for a, b in zip(query, embed_text(texts[exact[0]], 384),
                                                                     strict=True)), abs=1e-5)
