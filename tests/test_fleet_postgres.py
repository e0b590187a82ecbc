"""The tests' PostgreSQL: the pgserver wheel's server with pgvector, in a directory of the test's own (issue 27)."""

from __future__ import annotations

import os

import psycopg
import pytest

from tests.helpers import postgres
from tests.helpers.postgres import PostgresServer, running_postgres


def test_a_test_database_has_pgvector_and_answers_a_nearest_neighbour_query(fleet_dsn: str) -> None:
    with psycopg.connect(fleet_dsn) as conn:
        version = conn.execute("SHOW server_version_num").fetchone()
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, embedding vector(3))")
        conn.execute("INSERT INTO items VALUES (1, '[1,0,0]'), (2, '[0,1,0]'), (3, '[0.9,0.1,0]')")
        nearest = conn.execute("SELECT id FROM items ORDER BY embedding <=> '[1,0,0]' LIMIT 2").fetchall()
    assert version is not None
    assert int(version[0]) >= 160000
    assert [row[0] for row in nearest] == [1, 3]


def test_each_test_gets_a_database_of_its_own(postgres_server: PostgresServer, fleet_dsn: str) -> None:
    other = postgres_server.create_database()
    try:
        with psycopg.connect(fleet_dsn) as conn:
            conn.execute("CREATE TABLE mine (id int)")
        with psycopg.connect(postgres_server.dsn(other)) as conn:
            found = conn.execute("SELECT to_regclass('mine')").fetchone()
        assert found == (None,)
    finally:
        postgres_server.drop_database(other)


def test_the_server_is_stopped_and_its_directory_removed_when_the_test_fails() -> None:
    seen: list[PostgresServer] = []

    def failing_test() -> None:
        with running_postgres() as server:
            seen.append(server)
            assert (server.data / "PG_VERSION").is_file()
            raise RuntimeError("the test failed")

    with pytest.raises(RuntimeError, match="the test failed"):
        failing_test()
    (server,) = seen
    assert server.process is None
    assert not server.directory.exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(server.dsn(), connect_timeout=2)


def test_a_restarted_server_keeps_its_data_and_its_address(private_postgres: PostgresServer) -> None:
    name = private_postgres.create_database()
    with psycopg.connect(private_postgres.dsn(name)) as conn:
        conn.execute("CREATE TABLE kept (id int)")
        conn.execute("INSERT INTO kept VALUES (7)")
    private_postgres.restart()
    with psycopg.connect(private_postgres.dsn(name)) as conn:
        assert conn.execute("SELECT id FROM kept").fetchall() == [(7,)]


def test_a_server_starts_from_a_shared_copy_when_its_user_cannot_reach_the_checkout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As root the server runs as ``nobody``, which cannot enter a checkout under /root: the binaries are copied
    (with the libraries they load by a relative path) to the temporary directory once, and run from there."""
    if os.geteuid() != 0:
        pytest.skip("only root runs the server as another user")  # a developer's own account reaches its checkout
    monkeypatch.setattr(postgres, "_others_can_reach", lambda path: False)
    with running_postgres() as server:
        assert not server.bin.is_relative_to(postgres.binaries().parents[2])  # not from site-packages
        name = server.create_database()
        with psycopg.connect(server.dsn(name)) as conn:
            assert conn.execute("SELECT '[1,0]'::vector <=> '[1,0]'").fetchone() == (0.0,)
