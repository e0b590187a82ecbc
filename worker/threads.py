"""The thread of a pull/merge request a task opened (SPEC §13, §14): which issue's work it continues, on
which branch, and what the thread's last task did.

A task's pull/merge request records its thread twice: a marker in its body (survives a Redis without
persistence; the webhook payload carries it) and Redis keys by request and by branch (CI events name only
the branch). Follow-ups read the thread's history through :func:`thread_history`, the one place that will
switch to the thread memory of ``memory/`` once it lands.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

import redis

from contexts import ContextNotFoundError, ContextStore, TasukiError, jsonl
from contexts.names import SUMMARIES_FILE
from contexts.state import read_state
from worker.names import BRANCH_PREFIX, THREAD_PREFIX

THREAD_TTL_S = 180 * 24 * 3600  # a pull request may stay open for months
_MARKER = re.compile(r"<!-- tasuki-thread: (\{.*?\}) -->")
_NUMBER = re.compile(r"/(\d+)/?$")


@dataclass(frozen=True)
class Thread:
    """A pull/merge request opened by a task: its issue's task key, number, head branch, newest task."""

    task_key: dict[str, str]  # the thread's task key: the issue the work started from (one active task)
    pull_kind: str  # "pull_request" or "merge_request"
    pull: int
    branch: str
    last_uuid: str

    @classmethod
    def from_json(cls, data: Any) -> Thread | None:
        """A thread from its JSON form; None for anything malformed (markers are in people's text)."""
        try:
            key = {k: str(data["task_key"][k]) for k in ("task_source", "owner", "repo", "task_type", "task_id")}
            return cls(key, str(data["pull_kind"]), int(data["pull"]), str(data["branch"]), str(data["last_uuid"]))
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def pull_key(self) -> dict[str, str]:
        """The pull/merge request as a task key."""
        return {**self.task_key, "task_type": self.pull_kind, "task_id": str(self.pull)}


def followup_of(thread: Thread, kind: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``followup`` field of a task request continuing ``thread``."""
    return {"kind": kind, "pull_kind": thread.pull_kind, "pull": thread.pull, "branch": thread.branch,
            "previous": thread.last_uuid, **(details or {})}


def key_id(key: dict[str, str]) -> str:
    """A task key as one string: ``source/owner/repo/type/id``."""
    return "/".join(str(key[f]) for f in ("task_source", "owner", "repo", "task_type", "task_id"))


def branch_id(source: str, owner: str, repo: str, branch: str) -> str:
    """The Redis key of a Tasuki branch."""
    return f"{BRANCH_PREFIX}{source}/{owner}/{repo}:{branch}"


def marker(task_key: dict[str, str], branch: str, uuid: str) -> str:
    """The line a pull/merge request body carries (its number is not known before it is opened)."""
    data = {"task_key": task_key, "branch": branch, "last_uuid": uuid}
    return f"<!-- tasuki-thread: {json.dumps(data, separators=(',', ':'))} -->"


def parse_marker(body: str, pull_kind: str, pull: int) -> Thread | None:
    """The thread a pull/merge request body names (its last marker), if any."""
    found = _MARKER.findall(body or "")
    if not found:
        return None
    try:
        return Thread.from_json({**json.loads(found[-1]), "pull_kind": pull_kind, "pull": pull})
    except (ValueError, TypeError):
        return None


def change_number(url: str) -> int | None:
    """The number at the end of a pull/merge request's web URL (``.../pull/7``, ``.../merge_requests/7``)."""
    found = _NUMBER.search(url or "")
    return int(found.group(1)) if found else None


def record_thread(client: redis.Redis, thread: Thread, *, only_if_absent: bool = False) -> None:
    """Remember the thread by its pull/merge request and by its branch (the newest task wins); ``only_if_absent``
    replaces nothing (a repair that cannot tell whether a later task of the thread wrote meanwhile)."""
    pipe = client.pipeline(transaction=False)
    pipe.set(THREAD_PREFIX + key_id(thread.pull_key), json.dumps(asdict(thread)), ex=THREAD_TTL_S, nx=only_if_absent)
    pipe.set(THREAD_PREFIX + key_id(thread.task_key), json.dumps(asdict(thread)), ex=THREAD_TTL_S, nx=only_if_absent)
    pipe.set(branch_id(thread.task_key["task_source"], thread.task_key["owner"], thread.task_key["repo"],
                       thread.branch), key_id(thread.pull_key), ex=THREAD_TTL_S, nx=only_if_absent)
    pipe.execute()


def find_thread(client: redis.Redis, pull_key: dict[str, str], body: str = "", head: str = "") -> Thread | None:
    """The thread of a pull/merge request: Redis first (it knows the newest task), else the body's marker,
    trusted only when the request's head branch (``head``, from the payload) is the marker's branch: a body
    is people's text, and a copied marker must not aim a task at another branch."""
    raw = client.get(THREAD_PREFIX + key_id(pull_key))
    if raw:
        try:
            found = Thread.from_json(json.loads(raw))
        except ValueError:
            found = None
        if found is not None:
            return found
    from_body = parse_marker(body, pull_key["task_type"], int(pull_key["task_id"]))
    if from_body is None or not head or from_body.branch != head:
        return None
    same_repo = all(from_body.task_key[k] == pull_key[k] for k in ("task_source", "owner", "repo"))
    return from_body if same_repo else None


def find_issue_thread(client: redis.Redis, task_key: dict[str, str]) -> Thread | None:
    """The newest pull/merge request thread of an issue's task key (Redis only)."""
    raw = client.get(THREAD_PREFIX + key_id(task_key))
    try:
        return Thread.from_json(json.loads(raw)) if raw else None
    except ValueError:
        return None


def find_branch_thread(client: redis.Redis, source: str, owner: str, repo: str, branch: str) -> Thread | None:
    """The thread whose pull/merge request is from ``branch``."""
    raw = client.get(branch_id(source, owner, repo, branch))
    if not raw:
        return None
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    parts = text.split("/")
    if len(parts) != 5:
        return None
    return find_thread(client, dict(zip(("task_source", "owner", "repo", "task_type", "task_id"), parts,
                                        strict=True)))


def thread_history(store: ContextStore, uuid: str) -> str:
    """What the thread's previous task did: its latest summary and its final summary, from its context.

    The one reader of thread history; it switches to the thread memory (SPEC §13) when that lands.
    """
    try:
        directory = store.locate(uuid)
    except (ContextNotFoundError, TasukiError, OSError):
        return ""
    parts = []
    try:
        latest = jsonl.last_record(directory / SUMMARIES_FILE)
        if latest and latest.get("summary"):
            parts.append(f"Summary of its work:\n{latest['summary']}")
        state = read_state(directory)
    except (OSError, ValueError, TasukiError):
        return "\n\n".join(parts)
    result = state.get("result") or {}
    status = state.get("status", "?")
    final = result.get("summary") if isinstance(result, dict) else None
    parts.append(f"It ended {status}." + (f" Its final summary:\n{final}" if final else ""))
    if state.get("error"):
        parts.append(f"Error: {state['error']}")
    return "\n\n".join(parts)
