"""A Tasuki fleet on hosts that are network namespaces (tests/helpers/netns.py; SPEC §12, issue 27).

with tasuki_fleet(tmp_path, entries, hosts=3) as fleet:
    fleet.start_workers()                       # a task worker and a maintenance worker on every host
    uuid = fleet.send(fleet.issue(7, "Fix add()"))

- ``storage`` (10.77.0.1): PostgreSQL 16 with pgvector (tests/helpers/postgres.py, listening on its address) and a
  redis-server; the fleet's store and its broker.
- ``services`` (10.77.0.2): the scripted model (replay, gates included) and the fake forge with the bare git
  remote. Both serve from this test process, on sockets opened inside that namespace.
- ``host-1`` .. ``host-N``: each its own network, PID and UTS namespace (hostname ``host-N``), and its own
  directories for contexts, checkouts and mirrors; ``clocks={"host-1": "+300"}`` runs every process of a host with
  its wall clock that many seconds off (libfaketime, tests/helpers/faketime.py).

The test's own thread stays in the storage namespace while the fleet runs (:func:`tasuki_fleet`), so its clients
of PostgreSQL, Redis and Celery reach them by their addresses as any host does.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid as uuid_module
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis
from celery import Celery

from fleet.store import FleetStore
from replay import ReplayModel, ReplayServer, serve
from replay.trajectory import turns_from_entries
from tests.helpers.celery_worker import REPO_ROOT, worker_env
from tests.helpers.context_support import wait_for
from tests.helpers.fake_forge import FakeForge
from tests.helpers.faketime import faketime_env
from tests.helpers.netns import SUBNET, Host, Namespace, Network, network
from tests.helpers.postgres import PostgresServer, free_port
from tests.helpers.stack import make_buggy_repo
from worker.names import RUN_TASK, TASK_PREFIX, TASKS_QUEUE

REDIS_SERVER = "/usr/bin/redis-server"
FORGE_TOKEN = "fleet-forge-token-9e2f"
OWNER, REPO = "team", "calc"
READY_TIMEOUT_S = 90.0
# Test timings: heartbeat 1 s, a host's lock stale after 3 s, the lease 4 s by the database's clock, monitor 1 s.
TIMINGS = {
    "TASUKI__CONTEXTS__HEARTBEAT_INTERVAL_S": "1",
    "TASUKI__CONTEXTS__STALE_AFTER_S": "3",
    "TASUKI__FLEET__LEASE_S": "4",
    "TASUKI__MONITOR__INTERVAL_S": "1",
    "TASUKI__MONITOR__BEAT_LOCK_TTL_S": "2",
    "TASUKI__LLM__BACKOFF_BASE_S": "0.01",
    "TASUKI__COMPRESSION__START_TIMEOUT_S": "5",
}


def logging_turns(steps: int, gate: str, gate_turn: int) -> list[dict[str, Any]]:
    """``steps`` bash steps, each adding a line with its step and its host to ``log.txt``, then ``finish``; turn
    ``gate_turn`` is held at ``gate`` until the caller opens it."""
    entries: list[dict[str, Any]] = [
        {
            "content": f"Step {n}.",
            "tool_calls": [{"name": "bash", "arguments": {"command": f'echo "step {n} host=$(hostname)" >> log.txt'}}],
        }
        for n in range(steps)
    ]
    entries.append({"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"summary": "Logged."}}]})
    entries[gate_turn]["gate"] = gate
    return entries


@dataclass
class Fleet:
    """The fleet's parts, and the worker processes started on its hosts."""

    root: Path
    net: Network
    storage: Namespace
    services: Namespace
    postgres: PostgresServer
    database: str
    redis_url: str
    model: ReplayServer
    forge: FakeForge
    hosts: list[Host]
    clocks: dict[str, str] = field(default_factory=dict)  # hostname -> its clock's offset in seconds ("+300")
    settings: dict[str, str] = field(default_factory=dict)  # the test's own TASUKI__ settings over TIMINGS
    logs: list[Path] = field(default_factory=list)

    @property
    def dsn(self) -> str:
        return self.postgres.dsn(self.database)

    def env(self, host: Host) -> dict[str, str]:
        """A worker's settings on ``host``: the fleet's store and broker, the host's own directories, and its clock
        when it is off."""
        config = self.root / "config.yaml"
        config.write_text("")
        env = worker_env(
            {
                "TASUKI_CONFIG": str(config),
                "TASUKI__BROKER__URL": self.redis_url,
                "TASUKI__FLEET__STORE": self.dsn,
                "TASUKI__CONTEXTS__BASE_DIR": str(host.root / "contexts"),
                "TASUKI__CONTEXTS__WORKSPACES_DIR": str(host.root / "workspaces"),
                "TASUKI__CONTEXTS__GIT_CACHE_DIR": str(host.root / "git-cache"),
                "TASUKI__LLM__PROVIDER": "openai",
                "TASUKI__LLM__OPENAI__BASE_URL": self.model.openai_base_url,
                "TASUKI__LLM__OPENAI__MODEL": "scripted",
                "TASUKI__GITHUB__API_URL": self.forge.github_api_url,
                "GITHUB_TOKEN": FORGE_TOKEN,
                "TASUKI__SANDBOX__BACKEND": "none",  # bubblewrap's own namespaces are tested elsewhere
                **TIMINGS,
                **self.settings,
            }
        )
        offset = self.clocks.get(host.hostname)
        return env if offset is None else faketime_env(env, offset)

    def start_worker(self, host: Host, name: str, queues: str = "tasks", pool: str = "prefork") -> None:
        """``celery -A worker worker`` on ``host``, waited for until it answers a ping."""
        log = self.root / f"{host.hostname}-{name}.log"
        self.logs.append(log)
        options = f"-n {name}@%h -Q {queues} -c 1 -P {pool} --without-gossip --without-mingle -E -l INFO"
        command = [sys.executable, "-m", "celery", "-A", "worker", "worker", *options.split()]
        process = host.popen(command, env=self.env(host), log=log, cwd=REPO_ROOT)
        wanted = f"{name}@{host.hostname}"

        def answers() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"{wanted} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            return self.answers_ping(wanted)

        wait_for(answers, timeout=READY_TIMEOUT_S, what=f"{wanted} to answer a ping")

    def answers_ping(self, worker: str) -> bool:
        """Whether the Celery worker named ``worker`` (``name@hostname``) answers a ping through the broker."""
        probe = Celery(broker=self.redis_url)
        try:
            return any(worker in reply for reply in probe.control.ping(timeout=0.5) or [])
        except (redis.exceptions.ConnectionError, OSError):  # the probe's own connection dropped (CI run 13, a busy
            return False  # machine): not an answer yet; the deadline still bounds the wait
        finally:
            probe.close()

    def start_beat(self, host: Host) -> None:
        log = self.root / f"{host.hostname}-beat.log"
        self.logs.append(log)
        host.popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "worker",
                "beat",
                "-l",
                "INFO",
                "-s",
                str(host.root / "beat-schedule"),
            ],
            env=self.env(host),
            log=log,
            cwd=REPO_ROOT,
        )

    def start_workers(self) -> None:
        """On every host a task worker (one task at a time) and a maintenance worker (the monitor's passes); the
        beat on the last host."""
        for host in self.hosts:
            self.start_worker(host, "tasks")
            self.start_worker(host, "maint", queues="maintenance,compression", pool="solo")
        self.start_beat(self.hosts[-1])

    def issue(self, number: int, title: str) -> dict[str, Any]:
        """A task request for a new issue ``number`` of the forge's repository."""
        self.forge.add_item(OWNER, REPO, number, title)
        return {
            "task_key": {
                "task_source": "github",
                "owner": OWNER,
                "repo": REPO,
                "task_type": "issue",
                "task_id": str(number),
            },
            "user": "octocat",
        }

    def send(self, request: dict[str, Any]) -> str:
        """Enqueue ``tasuki.run_task`` as ``tasuki submit`` does; returns the task's UUID."""
        uuid = str(uuid_module.uuid4())
        with redis.Redis.from_url(self.redis_url) as client:
            client.set(TASK_PREFIX + uuid, json.dumps(request["task_key"]), ex=3600)
        app = Celery(broker=self.redis_url)
        try:
            app.send_task(RUN_TASK, args=[uuid, request], task_id=uuid, queue=TASKS_QUEUE)
        finally:
            app.close()
        return uuid

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` on the fleet's database."""
        with psycopg.connect(self.dsn, connect_timeout=5) as conn:
            return list(conn.execute(sql, args).fetchall())

    def holders(self) -> dict[str, str]:
        """The live leases' holders: hostname -> the task's UUID."""
        rows = self.query("SELECT uuid, holder FROM tasuki_leases WHERE holder IS NOT NULL")
        return {str(holder).split(":", 1)[0]: str(uuid) for uuid, holder in rows}

    def checkpoint(self, uuid: str) -> str:
        """The subject of the task's newest checkpoint on the remote ("" before the first)."""
        bare = self.forge.git_root / OWNER / f"{REPO}.git"
        listed = subprocess.run(
            ["git", "for-each-ref", "--format=%(refname) %(contents:subject)", "refs/heads/tasuki-checkpoints/"],
            cwd=bare,
            capture_output=True,
            text=True,
            check=True,
        )
        ref = next((line for line in listed.stdout.splitlines() if line.split(" ", 1)[0].endswith(f"-{uuid[:8]}")), "")
        return ref.split(" ", 1)[1] if " " in ref else ""

    def database_unreachable(self) -> Callable[[], None]:
        """Drop every packet to PostgreSQL's port on the storage host (a firewall rule in its namespace, gone with it):
        new connections time out, open ones go silent. Returns how to let them through again."""
        rule = ["INPUT", "-p", "tcp", "--dport", str(self.postgres.port), "-j", "DROP"]

        def firewall(action: str) -> None:
            subprocess.run(self.storage.exec_args("iptables", action, *rule), check=True, timeout=30)

        firewall("-I")
        return lambda: firewall("-D")

    def states(self) -> dict[str, dict[str, Any]]:
        """Every context's last committed ``state.json`` in the durable copy, by UUID."""
        return {str(uuid): state for uuid, state in self.query("SELECT uuid, state FROM tasuki_contexts")}

    def log_tail(self, chars: int = 3000) -> str:
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}" for log in self.logs if log.exists()
        )

    def wait_until(self, predicate: Callable[[], Any], what: str, timeout_s: float = 180.0) -> Any:
        """Poll ``predicate`` (a query, often) until it is truthy; fail with the hosts' logs after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.1)  # polling interval, bounded by the deadline
        raise AssertionError(f"timed out after {timeout_s}s waiting for {what}\n{self.log_tail()}")


@contextlib.contextmanager
def _postgres(storage: Namespace) -> Iterator[PostgresServer]:
    """PostgreSQL on the storage host's address, trusting the bridge's subnet (the hosts connect from there)."""
    directory = Path(tempfile.mkdtemp(prefix="tasuki-pg-"))  # short: the socket path has a 107-byte limit
    server = PostgresServer(directory, host=storage.address)
    try:
        server.init()
        with (server.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {SUBNET}.0/24 trust\n")
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def _redis(storage: Namespace, root: Path) -> Iterator[str]:
    """redis-server on the storage host's address; yields its URL. Its port is a free one, not 6379: Celery's client
    pools outlive a test, keyed by URL, and must never hand a later fleet a socket of an earlier one."""
    port = free_port(storage.address)
    options = f"--bind {storage.address} --port {port} --save '' --appendonly no --protected-mode no --dir {root}"
    with (root / "redis.log").open("ab") as log:
        process = subprocess.Popen(storage.exec_args(REDIS_SERVER, *shlex.split(options)), stdout=log, stderr=log)
    try:
        client = redis.Redis(host=storage.address, port=port, socket_connect_timeout=0.5)
        wait_for(lambda: _pings(client), timeout=READY_TIMEOUT_S, what="redis-server on the storage host")
        client.close()
        yield f"redis://{storage.address}:{port}/0"
    finally:
        process.kill()
        process.wait()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@contextlib.contextmanager
def tasuki_fleet(
    root: Path,
    entries: list[dict[str, Any]],
    hosts: int = 3,
    *,
    clocks: dict[str, str] | None = None,
    settings: dict[str, str] | None = None,
) -> Iterator[Fleet]:
    """The storage host, the services host and ``hosts`` worker hosts (``clocks``: hostname -> its clock's offset;
    ``settings``: TASUKI__ variables over :data:`TIMINGS`); every process and namespace is gone after, whatever
    happened inside."""
    with network(root) as net, contextlib.ExitStack() as stack:
        storage, services = net.namespace("storage"), net.namespace("services")
        stack.enter_context(storage.entered())  # this thread is a client on the storage host from here on
        postgres = stack.enter_context(_postgres(storage))
        database = postgres.create_database()
        FleetStore(postgres.dsn(database)).close()  # the schema, migrated before any host looks
        redis_url = stack.enter_context(_redis(storage, root))
        with services.entered():  # their listening sockets live on the services host
            model = stack.enter_context(serve(ReplayModel(turns_from_entries(entries)), host=services.address))
            forge = stack.enter_context(FakeForge(root / "forge", FORGE_TOKEN).serve(host=services.address))
        forge.add_repo(OWNER, REPO, make_buggy_repo(root / "source"))
        workers = [net.host(f"host-{n}") for n in range(1, hosts + 1)]
        for host in workers:  # the hosts die before the services they use stop
            stack.callback(host.shutdown)
        yield Fleet(
            root, net, storage, services, postgres, database, redis_url, model, forge, workers,
            clocks=dict(clocks or {}), settings=dict(settings or {}),
        )
