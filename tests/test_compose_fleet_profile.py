"""The compose file's ``fleet`` profile for real (issue 27, SPEC §12): the stack with its PostgreSQL as the store.

docker-compose.yml's top comment is followed as an operator would: ``--profile fleet`` on every compose command,
TASUKI_FLEET_STORE naming the postgres service, POSTGRES_PASSWORD and PGPASSWORD the same password. The image
``pgvector/pgvector:pg16`` is a stand-in built from the pgserver wheel (tests/helpers/docker_host.py); the rest
is tests/test_compose_stack.py's stack (its host-network override puts PostgreSQL on a free loopback port) with
two worker replicas. A stack of its own (its own compose project), so the one-host stack's tests stay as they are.

Deselect with ``-m "not compose"``; it runs in ``.ci/run``, and elsewhere skips when no Docker can be had.
"""

from __future__ import annotations

from collections.abc import Iterator
from uuid import UUID

import pytest

from tests.helpers.ci import cannot_run
from tests.helpers.compose_fleet import (
    BUSY_DEADLINE_S,
    TEST_TIMINGS,
    Fleet,
    assert_each_step_once,
    compose_fleet,
    healthy_services,
    resumed_after_its_container_dies,
    submit_held,
)
from tests.helpers.docker_host import DockerUnavailable

pytestmark = [pytest.mark.integration, pytest.mark.compose, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    try:
        with compose_fleet(tmp_path_factory.mktemp("compose-fleet"), TEST_TIMINGS, workers=2,
                           fleet_store=True) as running:
            running.stack.wait(lambda: postgres_healthy(running), BUSY_DEADLINE_S, "postgres to be healthy",
                               logs_of="postgres")
            yield running
    except DockerUnavailable as exc:
        cannot_run(str(exc))


def postgres_healthy(fleet: Fleet) -> bool:
    return any(name.startswith(f"{fleet.stack.project}-postgres") and status == "healthy"
               for name, status in fleet.stack.health().items())


def durable_copy(fleet: Fleet, uuid: str) -> dict[str, str]:
    """What PostgreSQL holds of a context: its state's status and attempt, its lease's epoch and holder, and the
    number of its messages."""
    rows = fleet.sql(
        "SELECT c.state->>'status', c.state->>'attempt', l.epoch, coalesce(l.holder, '(released)'), "  # noqa: S608
        "(SELECT count(*) FROM tasuki_records r WHERE r.uuid = c.uuid AND r.file = 'messages.jsonl') "
        f"FROM tasuki_contexts c JOIN tasuki_leases l USING (uuid) WHERE c.uuid = '{UUID(uuid)}'"  # a UUID's text
    )
    assert len(rows) == 1, f"the store has no context {uuid}: {rows}"
    return dict(zip(("status", "attempt", "epoch", "holder", "messages"), rows[0], strict=True))


def released_copy(fleet: Fleet, uuid: str) -> dict[str, str]:
    """The durable copy once its lease is released: ``finish`` releases it after the host's directory is moved to
    completed/, where the test sees the task finish."""
    copy: dict[str, str] = fleet.stack.wait(lambda: (c := durable_copy(fleet, uuid))["holder"] == "(released)" and c,
                                            BUSY_DEADLINE_S, f"task {uuid}'s lease to be released", logs_of="worker")
    return copy


def test_the_fleet_profile_adds_postgres_and_every_service_becomes_healthy(fleet: Fleet) -> None:
    services = healthy_services(fleet, BUSY_DEADLINE_S)

    assert services == ["beat", "flower", "maintenance", "postgres", "redis", "webhook", "worker", "worker"]
    postgres = fleet.stack.containers("postgres")[0]
    server_user = fleet.stack.engine.docker("exec", postgres, "stat", "-c", "%U", "/proc/1")
    assert server_user.stdout.strip() == "postgres"  # the entrypoint gave up root before it started the server


def test_every_tcp_connection_to_postgres_needs_the_password(fleet: Fleet) -> None:
    password = fleet.stack.variables["POSTGRES_PASSWORD"]

    assert fleet.sql("SELECT current_user", password=password) == [["tasuki"]]
    with pytest.raises(RuntimeError, match="password authentication failed"):
        fleet.sql("SELECT current_user", password="not-" + password)


def test_a_task_through_tasuki_submit_completes_with_its_durable_copy_in_postgres(fleet: Fleet) -> None:
    uuid = fleet.submit(fleet.new_issue())

    state = fleet.wait_finished(uuid)

    assert state["status"] == "completed", state
    assert_each_step_once(fleet, uuid)
    stored = released_copy(fleet, uuid)
    assert stored == {"status": "completed", "attempt": "1", "epoch": "1", "holder": "(released)",
                      "messages": str(len(fleet.messages(uuid)))}, stored
    # Made by Tasuki's schema migration at its first connection (the image's initdb makes no extension).
    assert fleet.sql("SELECT extname FROM pg_extension WHERE extname = 'vector'") == [["vector"]]


def test_a_worker_container_killed_mid_task_is_resumed_from_the_store_under_a_new_epoch(fleet: Fleet) -> None:
    number, uuid = submit_held(fleet)
    holding = durable_copy(fleet, uuid)
    assert holding["epoch"] == "1", holding
    assert holding["holder"] != "(released)", holding

    resumed_after_its_container_dies(fleet, number, uuid, "kill")

    stored = released_copy(fleet, uuid)
    # The taker's lease is the second epoch: the dead holder's lease expired and the store handed the task on.
    assert stored == {"status": "completed", "attempt": "2", "epoch": "2", "holder": "(released)",
                      "messages": str(len(fleet.messages(uuid)))}, stored
