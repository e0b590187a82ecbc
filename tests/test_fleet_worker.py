"""A real worker in fleet mode (SPEC §12, issue 27): a task run by a Celery worker process with ``fleet.store`` set
leaves its durable copy in PostgreSQL, line for line what the host's directory holds, and its memory there too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from fleet.durable import PostgresCopy
from fleet.store import FleetStore
from tests.helpers.model_server import model_server
from tests.helpers.schemas import validate_context_dir
from tests.helpers.stack import Stack, fix_calc_trajectory, local_request, make_buggy_repo

pytestmark = pytest.mark.integration


@pytest.fixture
def stack(tmp_path: Path, redis_url: str, redis_client: object, fleet_dsn: str) -> Iterator[Stack]:
    with model_server(fix_calc_trajectory()) as server:
        s = Stack(tmp_path, redis_url, server.url, {"TASUKI__FLEET__STORE": fleet_dsn})
        try:
            yield s
        finally:
            s.stop()


def test_a_task_run_in_fleet_mode_is_in_postgresql_as_on_the_hosts_disk(
    stack: Stack, tmp_path: Path, fleet_dsn: str
) -> None:
    stack.start_worker("w1")
    uuid = stack.send(local_request(make_buggy_repo(tmp_path / "repo")))
    state = stack.wait_finished(uuid)
    assert state["status"] == "completed", state

    with psycopg.connect(fleet_dsn) as conn:
        lease = conn.execute("SELECT epoch, holder FROM tasuki_leases WHERE uuid = %s", (uuid,)).fetchone()
    assert lease == (1, None)  # taken once, released at the end
    with psycopg.connect(fleet_dsn) as conn:  # the index row is the fleet's too (fleet/index.py)
        row = conn.execute("SELECT location, status FROM tasuki_index WHERE uuid = %s", (uuid,)).fetchone()
    assert row == ("completed", "completed")
    assert not (stack.contexts_dir / "index.sqlite3").exists()  # no host index in fleet mode
    rebuilt = tmp_path / "rebuilt" / uuid
    with FleetStore(fleet_dsn) as fleet:
        PostgresCopy(fleet).rebuild(uuid, rebuilt)
    validate_context_dir(rebuilt)
    completed = stack.contexts_dir / "completed" / uuid
    for name in ("messages.jsonl", "tools.jsonl", "summaries.jsonl"):
        assert (rebuilt / name).read_bytes() == (completed / name).read_bytes(), name
    assert json.loads((rebuilt / "state.json").read_text()) == json.loads((completed / "state.json").read_text())
    assert json.loads((rebuilt / "metadata.json").read_text()) == json.loads((completed / "metadata.json").read_text())
