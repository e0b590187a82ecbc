"""Episodes and embedders for memory tests: real stores on real files, vectors from the replay model's hash."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from memory import EmbeddingError, Episode
from replay.embeddings import embed_text

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def episode(uuid: str, repository: str = "github:acme/web", *, task: str, days_ago: float = 1.0,
            thread: str | None = None, **fields: object) -> Episode:
    """An episode ended ``days_ago`` before :data:`NOW`."""
    return Episode(
        uuid=uuid,
        repository=repository,
        thread=thread or f"{repository}#issue/{uuid[:4]}",
        ended_at=NOW - timedelta(days=days_ago),
        status=str(fields.pop("status", "completed")),
        task=task,
        **fields,  # type: ignore[arg-type]
    )


class HashEmbedder:
    """The replay model's embeddings, in process."""

    model = "tasuki-replay-embed"

    def __init__(self, dimensions: int = 64) -> None:
        self.dimensions = dimensions
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls += 1
        return [embed_text(t, self.dimensions) for t in texts]


class BrokenEmbedder:
    """An embedding endpoint that times out."""

    model = "broken"

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        raise EmbeddingError("embedding request timed out after 10s")
