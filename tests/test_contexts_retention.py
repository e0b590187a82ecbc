"""Retention of completed contexts (001 §8.1): a pure plan, then gzip and delete; readers see through gzip."""

from __future__ import annotations

import gzip
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from contexts import ContextStore, jsonl
from contexts.clock import iso
from contexts.queries import compute_stats, list_contexts, show_context
from contexts.retention import RetentionAction, apply_retention, gzip_context, plan_retention
from contexts.state import update_state
from tests.helpers.context_support import (
    CONFIG,
    TASK_KEY,
    every_context_is_valid,  # noqa: F401 - autouse: checks what each test left
    loose_modes,
)
from tests.helpers.schemas import validate_context_dir

NOW = datetime(2025, 9, 1, tzinfo=UTC)


def days_ago(days: float) -> datetime:
    return NOW - timedelta(days=days)


@pytest.mark.parametrize(
    ("age_days", "gzipped", "action"),
    [
        (1, False, None),
        (7, False, None),  # exactly gzip_after_days is not older than it
        (7.01, False, "gzip"),
        (8, True, None),  # already gzipped
        (30, True, None),
        (30.01, True, "delete"),
        (400, False, "delete"),  # deleting does not wait for a gzip first
    ],
)
def test_plan_retention_is_a_pure_function_of_now(age_days: float, gzipped: bool, action: str | None) -> None:
    planned = plan_retention([("u1", days_ago(age_days), gzipped)], NOW, gzip_after_days=7, delete_after_days=30)
    assert planned == ([RetentionAction("u1", action, days_ago(age_days))] if action else [])  # type: ignore[arg-type]


def finished(store: ContextStore, completed_days_ago: float, messages: int = 5) -> str:
    ctx = store.create(TASK_KEY, CONFIG, heartbeat=False)
    for n in range(messages):
        ctx.append_message("user" if n == 0 else "assistant", f"message {n}")
    ctx.append_tool("bash", {"command": "make test"}, "success", 12, result="ok")
    path = ctx.finish("completed")
    update_state(path, NOW, fsync=False, set_fields={"completed_at": iso(days_ago(completed_days_ago))})
    return ctx.uuid


def test_apply_retention_gzips_old_contexts_and_deletes_older_ones(tmp_path: Path) -> None:
    store = ContextStore(tmp_path, fsync="never")
    fresh, old, ancient = finished(store, 1), finished(store, 10), finished(store, 45)
    running = store.create(TASK_KEY, CONFIG, heartbeat=False)
    update_state(running.path, NOW, fsync=False, set_fields={"completed_at": iso(days_ago(100))})
    fresh_files = {p.name: p.read_bytes() for p in (store.completed_path(fresh)).iterdir()}

    dry = apply_retention(store, NOW, gzip_after_days=7, delete_after_days=30, dry_run=True)
    assert {(a.uuid, a.action) for a in dry} == {(old, "gzip"), (ancient, "delete")}
    assert store.completed_path(ancient).exists()
    assert (store.completed_path(old) / "messages.jsonl").exists()

    done = apply_retention(store, NOW, gzip_after_days=7, delete_after_days=30)

    assert {(a.uuid, a.action) for a in done} == {(old, "gzip"), (ancient, "delete")}
    assert not store.completed_path(ancient).exists()
    assert not (tmp_path / ".locks" / ancient).exists()
    gz_dir = store.completed_path(old)
    assert sorted(p.name for p in gz_dir.iterdir() if "jsonl" in p.name) == [
        "messages.jsonl.gz",
        "summaries.jsonl.gz",
        "tools.jsonl.gz",
    ]
    assert validate_context_dir(gz_dir) == {"messages.jsonl": 5, "summaries.jsonl": 0, "tools.jsonl": 1}
    assert {p.name: p.read_bytes() for p in store.completed_path(fresh).iterdir()} == fresh_files
    assert running.path.exists()
    assert (running.path / "messages.jsonl").exists()
    assert loose_modes(tmp_path) == {}
    assert apply_retention(store, NOW, gzip_after_days=7, delete_after_days=30) == []  # nothing left to do


def test_viewer_queries_read_gzipped_contexts(tmp_path: Path) -> None:
    store = ContextStore(tmp_path, fsync="never")
    uuid = finished(store, 10, messages=12)
    apply_retention(store, NOW, gzip_after_days=7, delete_after_days=30)

    detail = show_context(store, uuid, limit=3)
    assert [m["seq"] for m in detail.messages] == [10, 11, 12]
    assert detail.tools[0]["result"] == "ok"
    assert detail.summary.message_count == 12
    assert [item.uuid for item in list_contexts(store, status="completed")] == [uuid]
    stats = compute_stats(store)
    assert (stats.total, stats.completed, stats.avg_messages) == (1, 1, 12)


def test_a_crash_mid_gzip_leaves_the_plain_file_which_readers_prefer(tmp_path: Path) -> None:
    store = ContextStore(tmp_path, fsync="never")
    path = store.completed_path(finished(store, 10))
    plain = list(jsonl.iter_records(path / "messages.jsonl"))
    with open(path / "messages.jsonl", "rb") as src, gzip.open(path / "messages.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
        dst.write(b'{"seq":6,"role":"user","content":"only in the half-made archive","timestamp":"x"}\n')

    assert list(jsonl.iter_records(path / "messages.jsonl")) == plain
    gzip_context(path)  # retention runs again and finishes the job
    assert not (path / "messages.jsonl").exists()
    assert list(jsonl.iter_records(path / "messages.jsonl")) == plain
    validate_context_dir(path)
