"""What memory holds: episodes (one per finished task), thread and repository memories, recall hits.

Repositories and threads are named by strings: ``github:owner/name`` (or ``gitlab:``, ``gitea:``) or a local
repository's absolute path, and ``{repository}#{task_type}/{task_id}`` for a thread.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

EPISODE_TEXT_MAX_CHARS = 8000  # what is indexed and embedded of one episode; the row keeps everything


def repository_key(task_key: dict[str, Any], repo_path: str | None = None) -> str:
    """The repository a task works on: ``source:owner/name``, or a local repository's absolute path."""
    if task_key.get("task_source") == "local" and repo_path:
        return str(Path(repo_path).resolve())  # its real path: two spellings of one repository are one
    return f"{task_key['task_source']}:{task_key['owner']}/{task_key['repo']}"


def parse_repository(text: str, source: str = "github") -> str:
    """An operator's name for a repository (``owner/name`` or a path) as a repository key."""
    if text.startswith(("github:", "gitlab:", "gitea:")):
        return text
    if text.startswith(("/", ".", "~")) or Path(text).is_dir():
        return str(Path(text).expanduser().resolve())
    return f"{source}:{text}"


def thread_key(task_key: dict[str, Any], repository: str) -> str:
    """Every task on one issue or pull/merge request shares a thread."""
    return f"{repository}#{task_key.get('task_type', 'task')}/{task_key.get('task_id', '')}"


class Match(NamedTuple):
    """One episode a search found, with its score there (BM25: higher is better; KNN: cosine similarity)."""

    uuid: str
    score: float


@dataclass(frozen=True)
class Episode:
    """One finished task as memory keeps it (SPEC §13); every string is masked before it gets here."""

    uuid: str
    repository: str
    thread: str
    ended_at: datetime
    status: str
    task: str
    result: dict[str, Any] = field(default_factory=dict)  # branch, commit, pull/merge request
    latest_summary: str = ""
    final_summary: str = ""
    files_changed: tuple[str, ...] = ()
    failed_commands: tuple[dict[str, str], ...] = ()  # {"command": ..., "error": ...}
    error: str | None = None

    @property
    def learned(self) -> bool:
        """Whether the task left anything to learn from (a task cancelled before it ran did not)."""
        return bool(self.final_summary or self.latest_summary or self.files_changed or self.failed_commands
                    or self.error)

    def text(self) -> str:
        """What recall searches and embeds: the task, what came of it, the files and the failures."""
        parts = [self.task, self.final_summary, self.latest_summary, self.error or ""]
        parts.append(" ".join(self.files_changed))
        parts += [f"$ {c.get('command', '')}\n{c.get('error', '')}" for c in self.failed_commands]
        return "\n".join(p for p in parts if p)[:EPISODE_TEXT_MAX_CHARS]

    def meaning(self) -> str:
        """What recall embeds: :meth:`text` without the list of files. A list of paths says little about what
        a task was about and, in a small model's window, drowns a short task in path fragments (issue 29:
        paraphrase recall@5 of all-MiniLM-L6-v2 rose from 0.53 to 0.66 on the markupsafe set without it).
        BM25 still searches the paths."""
        parts = [self.task, self.final_summary, self.latest_summary, self.error or ""]
        parts += [f"$ {c.get('command', '')}\n{c.get('error', '')}" for c in self.failed_commands]
        return "\n".join(p for p in parts if p)[:EPISODE_TEXT_MAX_CHARS]

    def to_json(self) -> dict[str, Any]:
        """JSON-ready fields (``ended_at`` as ISO 8601)."""
        data = asdict(self)
        data["ended_at"] = self.ended_at.isoformat()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Episode:
        """The inverse of :meth:`to_json`."""
        return cls(
            uuid=data["uuid"],
            repository=data["repository"],
            thread=data["thread"],
            ended_at=datetime.fromisoformat(data["ended_at"]),
            status=data["status"],
            task=data["task"],
            result=dict(data.get("result") or {}),
            latest_summary=data.get("latest_summary") or "",
            final_summary=data.get("final_summary") or "",
            files_changed=tuple(data.get("files_changed") or ()),
            failed_commands=tuple(data.get("failed_commands") or ()),
            error=data.get("error"),
        )


@dataclass(frozen=True)
class Memory:
    """A thread or repository memory: the model's text, when it was last updated, the tasks it came from."""

    scope: str  # "thread" or "repository"
    key: str
    text: str
    updated_at: datetime
    sources: tuple[str, ...] = ()  # UUIDs of the episodes merged into it


@dataclass(frozen=True)
class RepositoryCount:
    """A repository with memory, for ``tasuki memory list``."""

    repository: str
    episodes: int
    threads: int
    has_memory: bool
    last_episode_at: datetime | None


@dataclass(frozen=True)
class StoreStatus:
    """What ``tasuki memory status`` shows."""

    location: str
    episodes: int
    repositories: int
    threads: int
    vectors: int
    vector_dimension: int | None
    embedding_model: str | None
    last_error: str | None
