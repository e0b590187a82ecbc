"""Eight worker processes write episodes into one memory store at once: none is lost, nothing corrupts."""

from __future__ import annotations

import multiprocessing
from multiprocessing.synchronize import Barrier
from pathlib import Path

import apsw

from memory.sqlite import SQLiteMemoryStore
from replay.embeddings import embed_text
from tests.helpers.memory_support import episode

PROCESSES = 8
EPISODES_EACH = 40


def write_episodes(path: str, worker: int, start: Barrier) -> None:
    """One worker process: open its own store, wait for the others, record its episodes, forget one."""
    store = SQLiteMemoryStore(Path(path))
    start.wait()
    for n in range(EPISODES_EACH):
        e = episode(f"w{worker}-{n}", f"github:acme/repo{worker % 2}", task=f"marker{worker}x{n} fixes bug {n}")
        store.add_episode(e, embed_text(e.text()))
    store.add_episode(episode(f"w{worker}-gone", task="to be forgotten"))
    assert store.forget_episode(f"w{worker}-gone") == 1
    store.close()


def test_eight_processes_write_at_once_and_every_episode_is_there(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    spawn = multiprocessing.get_context("spawn")  # fresh interpreters, like separate worker processes
    start = spawn.Barrier(PROCESSES)
    workers = [spawn.Process(target=write_episodes, args=(str(path), w, start)) for w in range(PROCESSES)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(timeout=120)
    assert [p.exitcode for p in workers] == [0] * PROCESSES

    db = apsw.Connection(str(path))
    assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert db.execute("INSERT INTO episode_text(episode_text) VALUES ('integrity-check')").fetchall() == []
    db.close()
    store = SQLiteMemoryStore(path)
    status = store.status()
    assert (status.episodes, status.vectors) == (PROCESSES * EPISODES_EACH, PROCESSES * EPISODES_EACH)
    for w in range(PROCESSES):
        for n in range(EPISODES_EACH):
            assert store.episode(f"w{w}-{n}") is not None
        assert store.bm25(f"github:acme/repo{w % 2}", f"marker{w}x7", 20)[0] == f"w{w}-7"
    store.close()
