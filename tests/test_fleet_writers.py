"""State written by someone other than a task's holder, in a fleet (SPEC §12, issue 27): a cancel request from a
host without the context, usage metered after the task ended, the monitor's repairs of an interrupted completion;
and the monitor finding a lost holder by its expired lease alone.

Hosts are context stores with directories and hostnames of their own on one real PostgreSQL (tests/helpers/
fleet_hosts.py), Redis is the session's real one; the cancel's end-to-end test runs a real Celery worker."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from contexts.clock import iso
from contexts.context import Context
from contexts.errors import ContextCompletedError, ContextNotFoundError, FencedError
from contexts.names import COMPLETED_DIR, LOCK_FILE, RUNNING_DIR
from contexts.state import read_state, update_state
from contexts.store import ContextStore
from contexts.usage import Usage
from scheduler.monitor import Monitor
from scheduler.plan import Policy
from tests.helpers.celery_worker import celery_client
from tests.helpers.cli_process import ok
from tests.helpers.context_support import CONFIG, TASK_KEY
from tests.helpers.fleet_hosts import HostFactory, committed_state, host_cli, one_step
from tests.helpers.model_server import model_server
from tests.helpers.stack import Stack, fix_calc_trajectory, local_request, make_buggy_repo
from worker.memory_tasks import MemoryCalls
from worker.metering import Meter
from worker.names import CANCEL_PREFIX, HEARTBEATS_KEY, RESENT_PREFIX, TASKS_QUEUE
from worker.settings import Settings
from worker.submit import request_cancel

REQUEST = {"task_key": TASK_KEY, "prompt": "the task"}


def lease_of(dsn: str, uuid: str) -> tuple[int, str | None]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT epoch, holder FROM tasuki_leases WHERE uuid = %s", (uuid,)).fetchone()
    assert row is not None
    return int(row[0]), row[1]


def expire_lease(dsn: str, uuid: str) -> None:
    """The holder died: its lease ran out by the database's clock."""
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE tasuki_leases SET expires_at = now() - interval '1 second' WHERE uuid = %s", (uuid,))


# -- cancel -----------------------------------------------------------------------------------------------------


def test_a_cancel_from_a_host_without_the_context_reaches_its_holder_through_the_store_and_shows_everywhere(
    host: HostFactory, fleet_dsn: str, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    a, b = host("a"), host("b")
    ctx = a.create(TASK_KEY, CONFIG, heartbeat=False, extra_metadata={"request": REQUEST})
    one_step(ctx, "step 1")
    with celery_client(redis_url) as app:
        said = request_cancel(app, redis_client, b, ctx.uuid)
    assert said == "cancel requested; the task stops at its next step, on whichever host holds it"
    assert not b.running_path(ctx.uuid).exists()  # written to the store, not to a directory of b's
    redis_client.delete(CANCEL_PREFIX + ctx.uuid)  # Redis lost the flag: the store alone carries the request
    assert committed_state(fleet_dsn, ctx.uuid)["cancel_requested"] is True
    assert not ctx.cancel_requested_elsewhere

    one_step(ctx, "step 2")  # the holder's next commit, from a state.json without the request

    assert ctx.cancel_requested_elsewhere  # the commit told the holder
    assert not ctx.read_state()["cancel_requested"]  # worker/run.py's _after_step writes it there (below, end to end)
    kept = committed_state(fleet_dsn, ctx.uuid)
    assert (kept["cancel_requested"], kept["llm_call_count"]) == (True, 2)  # the holder's step landed, the request kept
    elsewhere = tmp_path / "c" / "contexts"
    elsewhere.mkdir(parents=True)  # another host's own store, without this context
    shown = json.loads(ok(host_cli(elsewhere, fleet_dsn, "context", "show", ctx.uuid, "--json")))
    assert shown["state"]["cancel_requested"] is True

    ctx.detach()
    expire_lease(fleet_dsn, ctx.uuid)
    taken = host("c").open(ctx.uuid, heartbeat=False)  # another host resumes it: the request comes along
    try:
        assert taken.cancel_requested_elsewhere
        assert taken.read_state()["cancel_requested"] is True
    finally:
        taken.finish("cancelled")
    with celery_client(redis_url) as app, pytest.raises(ContextCompletedError):
        request_cancel(app, redis_client, b, ctx.uuid)
    with celery_client(redis_url) as app, pytest.raises(ContextNotFoundError):
        request_cancel(app, redis_client, b, "0b0e0a4c-0000-4000-8000-000000000000")
    assert not redis_client.exists(CANCEL_PREFIX + "0b0e0a4c-0000-4000-8000-000000000000")


def test_a_task_run_by_a_real_worker_stops_on_a_cancel_from_another_host_whose_redis_flag_was_lost(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, fleet_dsn: str
) -> None:
    trajectory = fix_calc_trajectory()
    trajectory.insert(1, {"gate": "cancel"})  # the second answer waits until the cancel is in the store
    with model_server(trajectory) as server:
        stack = Stack(tmp_path, redis_url, server.url, {"TASUKI__FLEET__STORE": fleet_dsn})
        try:
            stack.start_worker("w1")
            uuid = stack.send(local_request(make_buggy_repo(tmp_path / "repo")))
            stack.wait_until(lambda: server.model.gate_reached("cancel"), what="the task at its second answer")
            said = ok(host_cli(tmp_path / "other-host" / "contexts", fleet_dsn, "cancel", uuid,
                               TASUKI__BROKER__URL=redis_url))  # fmt: skip
            assert said.strip() == "cancel requested; the task stops at its next step, on whichever host holds it"
            redis_client.delete(CANCEL_PREFIX + uuid)
            server.model.open_gate("cancel")

            state = stack.wait_finished(uuid)
        finally:
            stack.stop()
    assert (state["status"], state["cancel_requested"], state["llm_call_count"]) == ("cancelled", True, 2)
    durable = committed_state(fleet_dsn, uuid)
    assert (durable["status"], durable["cancel_requested"]) == ("cancelled", True)


# -- metering -----------------------------------------------------------------------------------------------------


def fleet_settings(base: Path, dsn: str, redis_url: str) -> Settings:
    return Settings.model_validate(
        {"contexts": {"base_dir": str(base)}, "fleet": {"store": dsn}, "broker": {"url": redis_url}}
    )


def test_usage_metered_after_the_end_goes_into_the_durable_copy_from_any_host_and_never_past_a_holder(
    host: HostFactory, fleet_dsn: str, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    a = host("a")
    config = {**CONFIG, "endpoint": "http://127.0.0.1:9/v1"}  # the model a memory job would ask (it is not asked)
    ended = a.create(TASK_KEY, config, heartbeat=False, extra_metadata={"request": REQUEST})
    one_step(ended, "step 1")
    path = ended.finish("completed")
    before = committed_state(fleet_dsn, ended.uuid)
    memory_call = Usage("memory", "gpt-4o", 500, 50)

    # A memory job on the host that finished it: its state.json and the durable copy alike.
    Meter(fleet_settings(path.parent.parent, fleet_dsn, redis_url), "github/acme/api").record_finished(
        path, [memory_call]
    )
    assert committed_state(fleet_dsn, ended.uuid)["usage"] == read_state(path)["usage"]
    assert committed_state(fleet_dsn, ended.uuid)["total_tokens_used"] == before["total_tokens_used"] + 550

    # A memory job on a host without the context (MemoryCalls reads its metadata from the store).
    elsewhere = fleet_settings(tmp_path / "b" / "contexts", fleet_dsn, redis_url)
    spent = MemoryCalls(elsewhere, None, ended.uuid)
    spent.embedded(120)
    spent.meter()
    after = committed_state(fleet_dsn, ended.uuid)
    assert after["total_tokens_used"] == before["total_tokens_used"] + 550 + 120
    assert after["status"] == "completed"

    # A task still held: its holder's commits write its state, so nothing goes past them.
    held = a.create(TASK_KEY, CONFIG, heartbeat=False)
    one_step(held, "step 1")
    Meter(elsewhere, "github/acme/api").record_finished(None, [memory_call], held.uuid)
    assert "usage" not in committed_state(fleet_dsn, held.uuid)
    one_step(held, "step 2")
    assert committed_state(fleet_dsn, held.uuid)["llm_call_count"] == 2
    held.finish("completed")


# -- repairs ------------------------------------------------------------------------------------------------------


def crashed_while_completing(store: ContextStore, *, moved: bool) -> Context:
    """A holder that committed ``completing`` and died after it removed its lock (``moved``: and after the move to
    completed/), its last write ten minutes ago."""
    ctx = store.create(TASK_KEY, CONFIG, heartbeat=False, extra_metadata={"request": REQUEST})
    one_step(ctx, "step 1")
    ctx.update_state(status="completing", final_status="failed", error="tests fail", completed_at=iso(store.clock()))
    ctx.detach()
    running = store.running_path(ctx.uuid)
    (running / LOCK_FILE).unlink()
    directory = running
    if moved:
        directory = store.completed_path(ctx.uuid)
        os.rename(running, directory)
    update_state(directory, datetime.now(UTC) - timedelta(minutes=10), fsync=False)
    return ctx


@pytest.mark.parametrize("moved", [False, True], ids=["finish_move", "finish_status"])
def test_the_monitors_repair_of_an_interrupted_completion_is_final_in_the_durable_copy_under_its_own_lease(
    host: HostFactory, fleet_dsn: str, redis_client: redis.Redis, moved: bool
) -> None:
    holder = host("a")
    ctx = crashed_while_completing(holder, moved=moved)
    store = host("a")  # the same host's monitor, in another process
    monitor = Monitor(store, redis_client, Policy(stale_after_s=3, max_attempts=3, resume=True, hostname="host-a"),
                      send=lambda *_: None, ended=lambda *_: None)  # fmt: skip
    repair = "finish_status" if moved else "finish_move"
    assert committed_state(fleet_dsn, ctx.uuid)["status"] == "completing"

    [skipped] = monitor.run(datetime.now(UTC), deep=True)
    assert (skipped.action.repair, skipped.done) == (repair, False)
    assert "its fleet lease is still live" in skipped.detail
    where = holder.base_dir / (COMPLETED_DIR if moved else RUNNING_DIR) / ctx.uuid
    assert read_state(where)["status"] == "completing"  # nothing changed

    expire_lease(fleet_dsn, ctx.uuid)
    [repaired] = monitor.run(datetime.now(UTC), deep=True)
    assert (repaired.action.repair, repaired.done) == (repair, True)

    local = read_state(holder.completed_path(ctx.uuid))
    durable = committed_state(fleet_dsn, ctx.uuid)
    assert (local["status"], durable["status"]) == ("failed", "failed")
    assert durable == local
    assert lease_of(fleet_dsn, ctx.uuid) == (2, None)  # the repairer's own epoch, released
    with pytest.raises(FencedError):  # the dead holder's epoch writes nothing more
        ctx._durable.commit({"status": "completed"})  # the writer the dead holder left behind
    assert [o for o in monitor.run(datetime.now(UTC), deep=True) if o.done] == []  # done once


# -- the monitor's candidates -------------------------------------------------------------------------------------


def test_a_lost_holder_whose_heartbeat_never_reached_redis_is_found_by_its_expired_lease(
    host: HostFactory, fleet_dsn: str, redis_client: redis.Redis
) -> None:
    a = host("a")
    ctx = a.create(TASK_KEY, CONFIG, heartbeat=False, extra_metadata={"request": REQUEST})
    one_step(ctx, "step 1")
    ctx.detach()  # died; its heartbeat never reached the index
    done = a.create(TASK_KEY, CONFIG, heartbeat=False)
    done.finish("completed")
    assert redis_client.zcard(HEARTBEATS_KEY) == 0

    def send(uuid: str, request: dict[str, Any]) -> None:
        redis_client.rpush(TASKS_QUEUE, json.dumps([uuid, request]))  # a delivery nobody took yet

    b = host("b")
    monitor = Monitor(b, redis_client, Policy(stale_after_s=3, max_attempts=3, resume=True, hostname="host-b"),
                      send=send, ended=lambda *_: None)  # fmt: skip
    later = datetime.now(UTC) + timedelta(minutes=1)
    assert monitor.observe(later) == []  # a live lease is no candidate, a released one neither

    expire_lease(fleet_dsn, ctx.uuid)
    with psycopg.connect(fleet_dsn) as conn:  # finished, its holder died before the release: no candidate either
        conn.execute("UPDATE tasuki_leases SET holder = 'host-a:1' WHERE uuid = %s", (done.uuid,))
    expire_lease(fleet_dsn, done.uuid)
    [resumed] = monitor.run(later)

    assert (resumed.action.uuid, resumed.action.kind, resumed.done) == (ctx.uuid, "resume", True)
    assert resumed.action.owner == f"{a.holder}#1"
    assert [json.loads(m)[0] for m in redis_client.lrange(TASKS_QUEUE, 0, -1)] == [ctx.uuid]
    # The next pass, while that delivery waits in the tasks queue: nothing sent again, nothing counted (issue 24).
    [waiting] = monitor.run(later)
    assert (waiting.done, waiting.detail) == (False, "a delivery is waiting in the tasks queue")
    assert redis_client.llen(TASKS_QUEUE) == 1
    assert redis_client.get(RESENT_PREFIX + ctx.uuid) == "1"

    taken = host("c").open(ctx.uuid, heartbeat=False)  # the delivery is taken: a live lease again
    try:
        assert monitor.observe(later) == []
    finally:
        taken.finish("completed")
