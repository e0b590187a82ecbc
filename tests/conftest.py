"""Shared fixtures: Redis for tests (never touching data we did not create) and hermetic settings."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import fakeredis
import pytest
import redis

from tests.helpers.ci import cannot_run
from tests.helpers.redis_server import (
    CLAIM_KEY,
    DatabaseClaim,
    RedisUnavailableError,
    claim_empty_database,
    redis_answers,
    start_private_redis,
)
from worker import names
from worker.settings import Settings, load_settings

# postgres_server, fleet_dsn, private_postgres (PostgreSQL + pgvector); host (a fleet host's context store)
pytest_plugins = ("tests.helpers.postgres", "tests.helpers.fleet_hosts")

SHARED_HOST, SHARED_PORT = "127.0.0.1", 6379
# Keys a test may leave behind; Celery's bindings (_kombu.*) stay until the session ends, because a
# publisher that already declared its queue would not declare it again and its messages would vanish.
TEST_KEY_PATTERNS = ("tasuki:*", "celery-task-meta-*")
QUEUE_PATTERNS = tuple(f"{q}*" for q in names.QUEUES)  # a queue's list and its priority lists
SESSION_KEY_PATTERNS = (*TEST_KEY_PATTERNS, "celery*", "_kombu*", "unacked*", *QUEUE_PATTERNS)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The compose stack runs last: its images are built meanwhile (.ci/run starts that build first). The browser
    tests run just before it: after Playwright has run in a process, a test that forks without exec hangs in the
    child.

    Each of the two is one pytest-xdist group, run in order by one worker (``--dist loadgroup``) while the other
    workers go on with the rest: the compose tests share one stack on the host's network, the browser tests one
    browser.
    """
    items.sort(key=lambda item: (item.get_closest_marker("compose") is not None,
                                 item.get_closest_marker("browser") is not None))  # stable: the rest keep their order
    for item in items:
        for group in ("compose", "browser"):
            if item.get_closest_marker(group) is not None:
                item.add_marker(pytest.mark.xdist_group(group))



def delete_keys(client: redis.Redis, patterns: tuple[str, ...]) -> None:
    """Delete keys matching `patterns` in the database `client` points at, sparing the claim marker."""
    for pattern in patterns:
        doomed = [key for key in client.scan_iter(match=pattern, count=500) if key != CLAIM_KEY]
        if doomed:
            client.delete(*doomed)


@pytest.fixture(scope="session")
def redis_database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, DatabaseClaim | None]]:
    """The session's Redis: an empty database claimed on 127.0.0.1:6379, else a private server (no claim)."""
    claim = claim_empty_database(SHARED_HOST, SHARED_PORT) if redis_answers(SHARED_HOST, SHARED_PORT) else None
    if claim is not None:
        yield claim.url, claim
        client = redis.Redis.from_url(claim.url, decode_responses=True)
        delete_keys(client, SESSION_KEY_PATTERNS)
        client.close()
        claim.release()
        return
    try:
        url, stop = start_private_redis(tmp_path_factory.mktemp("redis"))
    except RedisUnavailableError as exc:
        cannot_run(f"no Redis: {exc}")
    yield url, None
    stop()


@pytest.fixture(scope="session")
def redis_url(redis_database: tuple[str, DatabaseClaim | None]) -> str:
    """A Redis URL whose database belongs to this test session alone."""
    return redis_database[0]


@pytest.fixture
def redis_client(redis_database: tuple[str, DatabaseClaim | None]) -> Iterator[redis.Redis]:
    """A client (str replies) on the session's database; the test's `tasuki:*` keys are deleted after it."""
    url, claim = redis_database
    client = redis.Redis.from_url(url, decode_responses=True)
    if claim is not None:
        claim.refresh(client)
    yield client
    delete_keys(client, TEST_KEY_PATTERNS)
    client.close()


@pytest.fixture(autouse=True)
def _no_queued_messages_outlive_their_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Messages a test left on a queue (a reply it caused, a job nobody took) are dropped after it, so that the next
    test's workers on the same database never take them. Only the queues' lists go, not Celery's bindings."""
    yield
    if "redis_database" not in request.fixturenames:
        return
    url, _claim = request.getfixturevalue("redis_database")
    client = redis.Redis.from_url(url)
    try:
        delete_keys(client, QUEUE_PATTERNS)
    except redis.RedisError:
        pass  # a test that stopped this Redis: nothing of it to clean
    finally:
        client.close()


@pytest.fixture
def fake_redis() -> Iterator[fakeredis.FakeRedis]:
    """An in-memory Redis of the test's own (str replies), for unit tests of Redis-using code."""
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def make_settings(tmp_path: Path) -> Callable[..., Settings]:
    """Settings from defaults plus the given `TASUKI__...` environment, contexts and workspaces under tmp_path.

    Hermetic: neither the developer's config.yaml nor their environment is read.
    """
    empty_config = tmp_path / "empty-config.yaml"
    empty_config.write_text("")

    def make(env: Mapping[str, str] | None = None) -> Settings:
        base = {
            "TASUKI__AGENT__FINISH_GATE": "false",  # scripted trajectories of one finish; the gate's tests turn it on
            "TASUKI__CONTEXTS__BASE_DIR": str(tmp_path / "contexts"),
            "TASUKI__CONTEXTS__WORKSPACES_DIR": str(tmp_path / "workspaces"),
            "TASUKI__CONTEXTS__GIT_CACHE_DIR": str(tmp_path / "git-cache"),
        }
        return load_settings(config_path=empty_config, env={**base, **(env or {})})

    return make


@pytest.fixture
def copy_settings(make_settings: Callable[..., Settings]) -> Callable[..., Settings]:
    """:func:`make_settings` with environments restored by copy (``environments.restore: copy``), for tests of what
    only copies have: spares, and the environment a warm copy keeps for its next task."""

    def make(env: Mapping[str, str] | None = None) -> Settings:
        return make_settings({"TASUKI__ENVIRONMENTS__RESTORE": "copy", **(env or {})})

    return make
