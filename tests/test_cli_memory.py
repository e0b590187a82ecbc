"""`tasuki memory status|list|show|search|forget|prune` as an operator runs them: real processes, a real store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from memory import Episode, Memory
from memory.sqlite import SQLiteMemoryStore
from replay.embeddings import embed_text
from tests.helpers.cli_process import ok, one_line_error
from tests.helpers.model_server import model_server
from worker.local_embeddings import local_available

RUN_TIMEOUT_S = 60
REPO = "github:acme/web"
OTHER = "github:evil/web"


def tasuki(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `tasuki ARGS` with the memory store under ``tmp`` (contexts root tmp/contexts, memory tmp/memory.db)."""
    config = tmp / "empty-config.yaml"
    config.touch()
    cwd = tmp / "cwd"
    cwd.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TASUKI", "COLUMNS"))}
    environ = {**base, "TASUKI_CONFIG": str(config), "TASUKI__CONTEXTS__BASE_DIR": str(tmp / "contexts"),
               "COLUMNS": "160", **env}
    script = Path(sys.executable).with_name("tasuki")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "cli.main"]
    return subprocess.run([*command, *args], capture_output=True, text=True, env=environ, cwd=cwd,
                          timeout=RUN_TIMEOUT_S, check=False)


def _episode(uuid: str, repository: str, task: str, days_ago: float, thread: str = "issue/1") -> Episode:
    return Episode(uuid, repository, f"{repository}#{thread}", datetime.now(UTC) - timedelta(days=days_ago),
                   "completed", task, final_summary="done", files_changed=("auth/login.py",))


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    store = SQLiteMemoryStore(tmp_path / "memory.db")
    episodes = [
        _episode("11111111-aaaa-4aaa-8aaa-000000000001", REPO, "Fix ImportError in auth/login.py", 1),
        _episode("11111111-aaaa-4aaa-8aaa-000000000002", REPO, "Document the Windows installation", 2, "issue/2"),
        _episode("11111111-aaaa-4aaa-8aaa-000000000003", REPO, "Very old work on the cache layer", 120, "issue/3"),
        _episode("22222222-bbbb-4bbb-8bbb-000000000001", OTHER, "Fix ImportError in auth/login.py", 1),
    ]
    for e in episodes:
        store.add_episode(e, embed_text(e.text()))
    store.put_memory(Memory("repository", REPO, "- tests: run `pytest -q` (from 1111…0001)", datetime.now(UTC),
                            ("11111111-aaaa-4aaa-8aaa-000000000001",)), REPO)
    store.put_memory(Memory("thread", f"{REPO}#issue/1", "- login import fixed", datetime.now(UTC)), REPO)
    store.close()
    return tmp_path


def test_status_names_the_store_counts_and_bm25_only(tmp: Path) -> None:
    text = ok(tasuki(tmp, "memory", "status"))
    assert str(tmp / "memory.db") in text
    assert "4 in 2 repositories" in text
    assert "Vectors:       4 of 64 dimensions" in text
    assert "none configured: BM25 only" in text
    data = json.loads(ok(tasuki(tmp, "memory", "status", "--json")))
    assert (data["episodes"], data["vector_dimension"], data["last_error"]) == (4, 64, None)


def test_status_names_the_local_embedder_and_whether_it_is_installed(tmp: Path) -> None:
    text = ok(tasuki(tmp, "memory", "status", TASUKI__MEMORY__EMBEDDINGS="local"))
    installed = local_available()
    assert "all-MiniLM-L6-v2 (local)" in text
    assert ("not installed: BM25 only" in text) is not installed


def test_status_without_a_store_says_so_and_creates_nothing(tmp_path: Path) -> None:
    text = ok(tasuki(tmp_path, "memory", "status"))
    assert "No memory store yet" in text
    assert not (tmp_path / "memory.db").exists()


def test_status_of_a_damaged_store_names_the_problem(tmp_path: Path) -> None:
    (tmp_path / "memory.db").write_bytes(b"garbage" * 1000)
    result = tasuki(tmp_path, "memory", "status")
    assert result.returncode == 1
    assert "Problem:" in result.stdout
    assert "damaged" in result.stdout
    assert "Traceback" not in result.stderr


def test_list_repositories_and_episodes_uuid_first(tmp: Path) -> None:
    text = ok(tasuki(tmp, "memory", "list"))
    assert REPO in text
    assert OTHER in text
    repos = json.loads(ok(tasuki(tmp, "memory", "list", "--json")))
    assert {(r["repository"], r["episodes"], r["has_memory"]) for r in repos} == {(REPO, 3, True), (OTHER, 1, False)}
    lines = ok(tasuki(tmp, "memory", "list", "--repo", "acme/web")).splitlines()
    assert lines[0].startswith("UUID")
    assert lines[1].startswith("11111111-aaaa-4aaa-8aaa-000000000001")
    episodes = json.loads(ok(tasuki(tmp, "memory", "list", "--repo", "acme/web", "--json")))
    assert [e["uuid"][-1] for e in episodes] == ["1", "2", "3"]
    assert all(e["repository"] == REPO for e in episodes)


def test_show_prints_the_repository_memory_and_its_threads(tmp: Path) -> None:
    text = ok(tasuki(tmp, "memory", "show", "acme/web"))
    assert "run `pytest -q`" in text
    assert "Thread issue/1:" in text
    assert "login import fixed" in text
    data = json.loads(ok(tasuki(tmp, "memory", "show", "acme/web", "--json")))
    assert data["memory"]["sources"] == ["11111111-aaaa-4aaa-8aaa-000000000001"]


def test_search_prints_every_score_and_stays_in_the_repository(tmp: Path) -> None:
    text = ok(tasuki(tmp, "memory", "search", "ImportError login.py", "--repo", "acme/web"))
    lines = text.splitlines()
    assert lines[0] == "note: no embedding model configured: BM25 only"
    assert lines[1].split() == ["UUID", "BM25", "VECTOR", "FUSED", "LEXICAL", "RECENCY", "SCORE", "TASK"]
    assert lines[2].startswith("11111111-aaaa-4aaa-8aaa-000000000001")
    assert "22222222" not in text
    data = json.loads(ok(tasuki(tmp, "memory", "search", "ImportError login.py", "--repo", "acme/web", "--json")))
    top = data["hits"][0]
    assert data["mode"] == "bm25"
    assert top["bm25_rank"] == 1
    assert top["vector_rank"] is None
    assert set(top) >= {"bm25", "vector", "fused", "lexical", "recency", "score"}


def test_search_of_a_repository_without_memory_says_so_in_one_line_and_fails(tmp: Path) -> None:
    line = one_line_error(tasuki(tmp, "memory", "search", "ImportError", "--repo", "acme/nothing-here"), 1)
    assert "no memory of github:acme/nothing-here" in line
    line = one_line_error(tasuki(tmp, "memory", "search", "ImportError", "--repo", "acme/web", "--source", "gitlab"), 1)
    assert "no memory of gitlab:acme/web" in line


def test_search_with_the_replay_models_embeddings_is_hybrid(tmp: Path) -> None:
    with model_server([]) as server:
        env = {"TASUKI__LLM__OPENAI__BASE_URL": server.openai_base_url,
               "TASUKI__MEMORY__EMBEDDING_MODEL": "tasuki-replay-embed"}
        data = json.loads(ok(tasuki(tmp, "memory", "search", "ImportError login.py", "--repo", "acme/web", "--json",
                                    **env)))
        status = ok(tasuki(tmp, "memory", "status", **env))
    assert data["mode"] == "hybrid"
    assert data["hits"][0]["vector_rank"] is not None
    assert "tasuki-replay-embed (openai)" in status


def test_forget_really_deletes(tmp: Path) -> None:
    second = "11111111-aaaa-4aaa-8aaa-000000000002"
    assert "1 episode deleted" in ok(tasuki(tmp, "memory", "forget", "--episode", second))
    assert "2 episodes deleted" in ok(tasuki(tmp, "memory", "forget", "--repo", "acme/web"))
    store = SQLiteMemoryStore(tmp / "memory.db")
    assert store.episodes(REPO) == []
    assert store.memory("repository", REPO) is None
    assert store.bm25(REPO, "ImportError", 20) == []
    assert store.status().vectors == 1
    store.close()
    line = one_line_error(tasuki(tmp, "memory", "forget", "--episode", "nope"), 1)
    assert "no episode nope" in line


def test_forget_a_thread(tmp: Path) -> None:
    assert "1 episode deleted" in ok(tasuki(tmp, "memory", "forget", "--thread", f"{REPO}#issue/1"))
    shown = ok(tasuki(tmp, "memory", "show", "acme/web"))
    assert "login import fixed" not in shown


def test_prune_deletes_episodes_older_than_prune_after_days(tmp: Path) -> None:
    text = ok(tasuki(tmp, "memory", "prune", "--dry-run"))
    assert text.splitlines() == ["Would delete 1 episodes older than 90 days.", "11111111-aaaa-4aaa-8aaa-000000000003"]
    ok(tasuki(tmp, "memory", "prune"))
    listed = json.loads(ok(tasuki(tmp, "memory", "list", "--repo", "acme/web", "--json")))
    assert len(listed) == 2
    text = ok(tasuki(tmp, "memory", "prune", "--dry-run", TASUKI__MEMORY__PRUNE_AFTER_DAYS="2"))
    assert text.splitlines() == ["Would delete 1 episodes older than 2 days.", "11111111-aaaa-4aaa-8aaa-000000000002"]


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (("memory", "list"), 1, "no memory store"),
        (("memory", "search", "x"), 2, "--repo"),
        (("memory", "forget"), 2, "one of the arguments"),
        (("memory", "forget", "--episode", "a", "--repo", "b"), 2, "not allowed with"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, args: tuple[str, ...], code: int, words: str) -> None:
    assert words in one_line_error(tasuki(tmp_path, *args), code)
