"""Embeddings through both providers' official clients against the replay model over real HTTP."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from memory import EmbeddingError
from memory.search import embed_checked
from replay.embeddings import embed_text
from tests.helpers.model_server import model_server
from worker.embeddings import OllamaEmbedder, OpenAIEmbedder


def make(
    kind: str, url: str, model: str = "tasuki-replay-embed", timeout_s: float = 10.0
) -> OpenAIEmbedder | OllamaEmbedder:
    if kind == "openai":
        return OpenAIEmbedder(model, base_url=f"{url}/v1", api_key=None, timeout_s=timeout_s)
    return OllamaEmbedder(model, host=url, timeout_s=timeout_s)


@pytest.mark.parametrize("kind", ["openai", "ollama"])
def test_replay_model_answers_embeddings_in_both_apis(kind: str) -> None:
    with model_server([]) as server:
        vectors = make(kind, server.url).embed(["fix the login bug", "テストが失敗する"])
        paths = [r["path"] for r in server.requests]
    assert vectors == [embed_text("fix the login bug"), embed_text("テストが失敗する")]
    assert paths == ["/v1/embeddings" if kind == "openai" else "/api/embed"]


@pytest.mark.parametrize("kind", ["openai", "ollama"])
def test_model_name_suffix_changes_the_dimension(kind: str) -> None:
    with model_server([]) as server:
        [vector] = make(kind, server.url, model="tasuki-replay-embed-16").embed(["x"])
    assert len(vector) == 16


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A server that accepts connections and never answers (an embedding endpoint that hangs)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


@pytest.mark.parametrize("kind", ["openai", "ollama"])
def test_a_hanging_endpoint_is_an_embedding_error_after_the_timeout(kind: str, silent_server: str) -> None:
    with pytest.raises(EmbeddingError, match="tasuki-replay-embed"):
        make(kind, silent_server, timeout_s=0.3).embed(["x"])


def test_a_refused_connection_is_an_embedding_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for kind in ("openai", "ollama"):
        with pytest.raises(EmbeddingError):
            make(kind, f"http://127.0.0.1:{port}").embed(["x"])


def test_vectors_that_do_not_fit_are_refused() -> None:
    class Ragged:
        model = "ragged"

        def embed(self, texts: object) -> list[list[float]]:
            return [[1.0, 0.0], [1.0]]

    class Infinite:
        model = "inf"

        def embed(self, texts: object) -> list[list[float]]:
            return [[float("nan")]]

    with pytest.raises(EmbeddingError, match="dimensions"):
        embed_checked(Ragged(), ["a", "b"])
    with pytest.raises(EmbeddingError, match="2 vectors for 3 texts"):
        embed_checked(Ragged(), ["a", "b", "c"])
    with pytest.raises(EmbeddingError, match="not finite"):
        embed_checked(Infinite(), ["a"])
