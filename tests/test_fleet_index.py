"""The context index as a table in the fleet's PostgreSQL, and ``tasuki fleet import`` (SPEC §12, issue 27).

Two "hosts" are two context stores with their own directories and hostnames on one real PostgreSQL (pgvector from
the ``pgserver`` wheel); the commands run as subprocesses, as an operator runs them."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cli.reading import FOLLOWING_ELSEWHERE
from contexts.context import Context
from contexts.durable import ONE_HOST
from contexts.index import ContextIndex
from contexts.names import COMPLETED_DIR, JSONL_FILES, RUNNING_DIR
from contexts.queries import indexed_stats, list_page
from contexts.store import ContextStore
from fleet.durable import PostgresCopy
from fleet.index import PostgresIndex
from fleet.store import FleetStore
from tests.helpers.cli_process import ok
from tests.helpers.context_support import CONFIG, TASK_KEY
from tests.helpers.fleet_hosts import TASUKI, host_cli_options
from tests.helpers.fleet_hosts import host_cli as tasuki
from tests.helpers.model_server import model_server
from tests.helpers.schemas import validate_context_dir
from tests.helpers.stack import Stack, fix_calc_trajectory, local_request, make_buggy_repo
from worker.settings import Settings
from worker.stores import CONTEXT_INDEXES, open_store

HostFactory = Callable[..., ContextStore]


@pytest.fixture
def host(tmp_path: Path, fleet_dsn: str) -> Iterator[HostFactory]:
    """``host("a")``: a context store of its own directory and hostname, its index in the test's database."""
    stores: list[FleetStore] = []

    def make(name: str) -> ContextStore:
        fleet = FleetStore(fleet_dsn)
        stores.append(fleet)
        return ContextStore(
            tmp_path / name / "contexts",
            hostname=f"host-{name}",
            fsync="never",
            durable=PostgresCopy(fleet),
            index=lambda root: PostgresIndex(fleet, root, host=f"host-{name}"),
        )

    yield make
    for fleet in stores:
        fleet.close()


def one_step(ctx: Context, text: str) -> None:
    ctx.append_message("assistant", text, tool_calls=[{"id": "c1", "type": "function"}])
    ctx.append_tool("bash", {"command": "ls"}, "success", 12, result="README.md")
    ctx.append_message("tool", "README.md", tool_call_id="c1")
    ctx.stage_state(add={"llm_call_count": 1, "tool_call_count": 1, "total_tokens_used": 100}, status="processing")
    ctx.step_done()


def finished(store: ContextStore, user: str, steps: int, status: str = "completed") -> Context:
    ctx = store.create(TASK_KEY, CONFIG, user=user, heartbeat=False)
    ctx.append_message("user", "Fix the bug.")
    for n in range(steps):
        one_step(ctx, f"step {n}")
    ctx.finish(status)
    return ctx


def index_row(dsn: str, uuid: str) -> tuple[Any, ...] | None:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT host, location, status, steps, tokens FROM tasuki_index WHERE uuid = %s", (uuid,)
        ).fetchone()


def test_the_index_row_follows_the_context_and_every_host_reads_every_hosts_contexts(
    host: HostFactory, fleet_dsn: str
) -> None:
    a, b = host("a"), host("b")
    done = finished(a, "alice", 3)
    failed = finished(a, "bob", 1, status="failed")
    assert index_row(fleet_dsn, done.uuid) == ("host-a", COMPLETED_DIR, "completed", 3, 300)

    running = b.create(TASK_KEY, CONFIG, user="carol", heartbeat=False)
    assert index_row(fleet_dsn, running.uuid) == ("host-b", RUNNING_DIR, "initializing", 0, 0)
    one_step(running, "on b")
    assert index_row(fleet_dsn, running.uuid)[:3] == ("host-b", RUNNING_DIR, "processing")  # type: ignore[index]

    for reader in (a, b, host("c")):  # c has no context of its own
        page = list_page(reader)
        assert [item.uuid for item in page.items] == [running.uuid, failed.uuid, done.uuid]
        assert page.total == 3
        stats = indexed_stats(reader)
        assert (stats.total, stats.running, stats.completed) == (3, 1, 2)
        assert stats.by_status == {"completed": 1, "failed": 1, "processing": 1}
        assert stats.by_user == {"alice": 1, "bob": 1, "carol": 1}
        assert list_page(reader, user="alice").total == 1
        assert reader.index.count(location=COMPLETED_DIR, status="failed") == 1

    running.finish("completed")
    assert index_row(fleet_dsn, running.uuid) == ("host-b", COMPLETED_DIR, "completed", 1, 100)
    assert host("c").index.ended_since(datetime(2000, 1, 1, tzinfo=UTC)) == {"completed": 2, "failed": 1}


def test_the_fleet_tallies_equal_the_one_host_index_of_the_same_contexts(host: HostFactory) -> None:
    a = host("a")
    for n in range(6):
        finished(a, ("alice", "bob", "carol")[n % 3], n, status=("completed", "failed")[n % 2])
    sqlite = ContextIndex(a.base_dir)  # the same directories, indexed as one host would
    fleet = a.index
    for filters in ({}, {"status": "failed"}, {"user": "bob"}, {"location": COMPLETED_DIR}):
        assert fleet.totals(**filters) == sqlite.totals(**filters), filters
        assert fleet.count(**filters) == sqlite.count(**filters), filters
    assert [e.uuid for e in fleet.page(limit=4, offset=1)] == [e.uuid for e in sqlite.page(limit=4, offset=1)]
    assert fleet.summaries(limit=None) == sqlite.summaries(limit=None)
    sqlite.close()


def test_reconcile_and_rebuild_touch_only_this_hosts_rows(host: HostFactory, fleet_dsn: str) -> None:
    a, b = host("a"), host("b")
    mine, theirs = finished(a, "alice", 1), finished(b, "bob", 1)
    with psycopg.connect(fleet_dsn) as conn:  # a crash between the move and the index write
        conn.execute(
            "UPDATE tasuki_index SET location = 'running', status = 'processing' WHERE uuid = %s", (mine.uuid,)
        )
    assert a.index.reconcile() == 1
    assert index_row(fleet_dsn, mine.uuid)[:3] == ("host-a", COMPLETED_DIR, "completed")  # type: ignore[index]
    assert a.index.rebuild() == 1
    assert index_row(fleet_dsn, theirs.uuid) is not None  # b's row: b's directories are not a's to judge
    assert a.index.count() == 2


def test_context_show_on_another_host_rebuilds_from_the_durable_copy(
    host: HostFactory, fleet_dsn: str, tmp_path: Path
) -> None:
    done = finished(host("a"), "alice", 2)
    elsewhere = tmp_path / "c" / "contexts"
    elsewhere.mkdir(parents=True)  # another worker host's own store, without this context
    text = ok(tasuki(elsewhere, fleet_dsn, "context", "show", done.uuid, "--json"))
    shown = json.loads(text)
    assert shown["context"]["uuid"] == done.uuid
    assert shown["context"]["status"] == "completed"
    assert [m["content"] for m in shown["messages"]][-2:] == ["step 1", "README.md"]
    listed = json.loads(ok(tasuki(elsewhere, fleet_dsn, "context", "list", "--json")))
    assert [item["uuid"] for item in listed] == [done.uuid]
    assert not list((elsewhere / COMPLETED_DIR).iterdir())  # read, not copied to this host


def test_context_show_follow_on_another_host_prints_each_committed_step_until_the_end(
    host: HostFactory, fleet_dsn: str, tmp_path: Path
) -> None:
    a = host("a")
    running = a.create(TASK_KEY, CONFIG, user="alice", heartbeat=False)
    running.append_message("user", "Fix the bug.")
    one_step(running, "first step on a")
    elsewhere = tmp_path / "c" / "contexts"
    elsewhere.mkdir(parents=True)
    proc = subprocess.Popen(
        [*TASUKI, "context", "show", running.uuid, "--follow"],
        **host_cli_options(elsewhere, fleet_dsn),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, ""):
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()

    def wait_for(text: str) -> None:
        deadline = time.monotonic() + 120
        while text not in lines.get(timeout=max(deadline - time.monotonic(), 0)):
            pass

    try:
        wait_for("first step on a")  # the view as committed, then the follow
        one_step(running, "second step on a")  # committed on host a after the viewer began
        wait_for("second step on a")
        running.finish("completed")
        wait_for("Status: completed")
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
        proc.wait()
    assert proc.stderr is not None
    assert proc.stderr.read().strip() == f"tasuki: note: {FOLLOWING_ELSEWHERE}"
    assert not list((elsewhere / RUNNING_DIR).iterdir())  # followed, never copied to this host


def test_the_registry_picks_the_index_by_the_stores_scheme(tmp_path: Path, fleet_dsn: str) -> None:
    assert set(CONTEXT_INDEXES) == {"", "postgresql", "postgres"}
    one = open_store(Settings(contexts={"base_dir": str(tmp_path / "one")}), must_exist=False)
    assert isinstance(one.index, ContextIndex)
    fleet = open_store(
        Settings(contexts={"base_dir": str(tmp_path / "fleet")}, fleet={"store": fleet_dsn}), must_exist=False
    )
    assert isinstance(fleet.index, PostgresIndex)
    assert one.durable is ONE_HOST


# -- tasuki fleet import -----------------------------------------------------------------------------


@pytest.fixture
def one_host_store(tmp_path: Path, redis_url: str, redis_client: object) -> Iterator[Stack]:
    """A one-host store made by real tasks: a Celery worker, the scripted model, git."""
    with model_server(fix_calc_trajectory() * 2) as server:
        stack = Stack(tmp_path / "one-host", redis_url, server.url)
        stack.root.mkdir()
        try:
            stack.start_worker("w1")
            for n in range(2):
                uuid = stack.send(local_request(make_buggy_repo(tmp_path / f"repo{n}")))
                assert stack.wait_finished(uuid)["status"] == "completed"
        finally:
            stack.stop()
        yield stack


@pytest.mark.integration
def test_fleet_import_copies_a_one_host_store_once(one_host_store: Stack, fleet_dsn: str, tmp_path: Path) -> None:
    base = one_host_store.contexts_dir
    uuids = sorted(p.name for p in (base / COMPLETED_DIR).iterdir())
    assert len(uuids) == 2
    broken = base / COMPLETED_DIR / "00000000-0000-4000-8000-000000000001"
    broken.mkdir(mode=0o700)
    (broken / "metadata.json").write_text("{not json")

    first = tasuki(base, fleet_dsn, "fleet", "import")
    assert first.returncode == 1, first.stderr
    assert first.stderr.count("\n") == 1
    assert "00000000-0000-4000-8000-000000000001" in first.stderr
    assert "Traceback" not in first.stderr
    assert first.stdout.startswith("imported 2 contexts (0 already in the fleet)")
    episodes = int(first.stdout.split(", ")[1].split()[0])  # "imported N contexts (...), E episodes, ..."
    assert (base.parent / "memory.db").is_file()
    assert episodes == 2  # each task's episode, from memory.db

    with psycopg.connect(fleet_dsn) as conn:
        counted = conn.execute("SELECT count(*) FROM tasuki_records").fetchone()
    second = tasuki(base, fleet_dsn, "fleet", "import")
    assert second.stdout.startswith("imported 0 contexts (2 already in the fleet), 0 episodes, 0 memories")
    with psycopg.connect(fleet_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM tasuki_records").fetchone() == counted
        assert conn.execute("SELECT count(*) FROM tasuki_index").fetchone() == (2,)
        assert conn.execute("SELECT count(*) FROM tasuki_episodes").fetchone() == (episodes,)

    # Another host reads them from PostgreSQL; each rebuilds byte for byte as the one host's directory.
    elsewhere = tmp_path / "other" / "contexts"
    elsewhere.mkdir(parents=True)
    listed = json.loads(ok(tasuki(elsewhere, fleet_dsn, "context", "list", "--json")))
    assert sorted(item["uuid"] for item in listed) == uuids
    stats = json.loads(ok(tasuki(elsewhere, fleet_dsn, "stats", "--json")))
    assert (stats["total"], stats["by_status"]) == (2, {"completed": 2})
    with FleetStore(fleet_dsn) as fleet:
        for uuid in uuids:
            rebuilt = tmp_path / "rebuilt" / uuid
            PostgresCopy(fleet).rebuild(uuid, rebuilt)
            validate_context_dir(rebuilt)
            for name in JSONL_FILES:
                assert (rebuilt / name).read_bytes() == (base / COMPLETED_DIR / uuid / name).read_bytes(), name


def test_fleet_import_without_a_fleet_store_is_one_line(tmp_path: Path) -> None:
    base = tmp_path / "contexts"
    base.mkdir()
    result = tasuki(base, None, "fleet", "import")
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0
    assert "fleet.store is not set" in result.stderr
