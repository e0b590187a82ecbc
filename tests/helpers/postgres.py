"""PostgreSQL 16 with pgvector for tests: a real server of the test's own, from the ``pgserver`` wheel's binaries.

The machine's own PostgreSQL has no pgvector, so the tests run the server the wheel carries, in a temporary
directory of their own: ``initdb`` there, ``postgres`` listening on 127.0.0.1 at a free port (and on a socket in
that directory), stopped and removed when the test ends, also when it fails. pgserver's own ``get_server`` is not
used: as root it adds a system user and widens the permissions of every parent directory; this helper only runs
the binaries, as ``nobody`` when the tests run as root (PostgreSQL refuses to run as root) — from a copy kept in
the temporary directory when ``nobody`` cannot reach the checkout (:func:`binaries_for`).

Fixtures (registered in tests/conftest.py):

- ``postgres_server`` — one server per test session (per xdist worker);
- ``fleet_dsn`` — a fresh database on it for one test, dropped afterwards;
- ``private_postgres`` — a server of the test's own, for tests that stop or restart it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.helpers.ci import cannot_run
from tests.helpers.context_support import wait_for

START_TIMEOUT_S = 60.0  # initdb and the first start on a loaded two-core machine
STOP_TIMEOUT_S = 30.0
UNPRIVILEGED_USER = "nobody"


class PostgresUnavailableError(RuntimeError):
    """The pgserver wheel is not installed, or its server did not start."""


def binaries() -> Path:
    """The ``bin`` directory of the PostgreSQL that the pgserver wheel carries (found without importing pgserver,
    whose import sets up a process-wide server registry and lock file)."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise PostgresUnavailableError("the pgserver wheel is not installed (pip install -e '.[test]')")
    found = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (found / "postgres").is_file():
        raise PostgresUnavailableError(f"no postgres binary in {found}")
    return found


def _others_can_reach(path: Path) -> bool:
    """Whether a user of no group of ours can reach ``path``: every directory above it searchable by others."""
    return all(parent.stat().st_mode & 0o001 for parent in (path, *path.parents))


def binaries_for(user: str | None) -> Path:
    """:func:`binaries`, or a copy of the whole installation in the temporary directory when ``user`` (the server's
    unprivileged user, when the tests run as root) cannot reach the checkout's (a clone under /root, say). The copy
    is made once per installation and renamed into place whole, so concurrent test processes share it."""
    found = binaries()
    if user is None or _others_can_reach(found):
        return found
    install = found.parent  # .../site-packages/pgserver/pginstall; its binaries find their libraries at
    libs = install.parent.parent / "pgserver.libs"  # $ORIGIN/../../../pgserver.libs: the layout is kept
    stamp = hashlib.sha256(f"{install}:{(found / 'postgres').stat().st_mtime_ns}".encode()).hexdigest()[:12]
    shared = Path(tempfile.gettempdir()) / f"tasuki-pgserver-{stamp}"
    if not shared.is_dir():
        staging = Path(tempfile.mkdtemp(prefix=f"{shared.name}.", dir=shared.parent))
        shutil.copytree(install, staging / "pgserver" / "pginstall", symlinks=True)
        if libs.is_dir():
            shutil.copytree(libs, staging / "pgserver.libs", symlinks=True)
        for directory in (staging, staging / "pgserver"):
            directory.chmod(0o755)
        with contextlib.suppress(OSError):  # another test process made it first
            os.rename(staging, shared)
        shutil.rmtree(staging, ignore_errors=True)
    return shared / "pgserver" / "pginstall" / "bin"


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class PostgresServer:
    """One ``postgres`` process on a data directory under ``directory`` (which this object owns)."""

    def __init__(self, directory: Path, *, host: str = "127.0.0.1") -> None:
        self.directory = directory
        self.data = directory / "data"
        self.sockets = directory / "sockets"
        self.log_path = directory / "postgres.log"
        self.host = host
        self.port = free_port(host)
        self._user = UNPRIVILEGED_USER if os.geteuid() == 0 else None
        self.bin = binaries_for(self._user)
        self.process: subprocess.Popen[bytes] | None = None

    def _run_as(self) -> dict[str, object]:
        return {"user": self._user, "group": pwd.getpwnam(self._user).pw_gid} if self._user else {}

    def init(self) -> None:
        """``initdb``: trust authentication for the superuser ``postgres`` (the server listens on loopback only)."""
        self.sockets.mkdir(mode=0o700)
        if self._user:
            entry = pwd.getpwnam(self._user)
            for path in (self.directory, self.sockets):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        made = subprocess.run(
            [
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-sync",
            ],
            cwd=self.directory,
            capture_output=True,
            text=True,
            check=False,
            timeout=START_TIMEOUT_S,
            **self._run_as(),  # type: ignore[arg-type]
        )
        if made.returncode != 0:
            raise PostgresUnavailableError(f"initdb failed: {(made.stderr or made.stdout).strip()[-500:]}")

    def start(self) -> None:
        """Start ``postgres`` and wait until it accepts connections."""
        log = self.log_path.open("ab")
        try:
            self.process = subprocess.Popen(
                [
                    str(self.bin / "postgres"),
                    "-D",
                    str(self.data),
                    "-p",
                    str(self.port),
                    "-k",
                    str(self.sockets),
                    "-c",
                    f"listen_addresses={self.host}",
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=100",
                ],
                cwd=self.directory,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **self._run_as(),  # type: ignore[arg-type]
            )
        finally:
            log.close()
        try:
            wait_for(self._answers, timeout=START_TIMEOUT_S, what=f"postgres on {self.host}:{self.port}")
        except AssertionError as exc:
            self.stop()
            raise PostgresUnavailableError(f"{exc}; log: {self.log_tail()}") from exc

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise PostgresUnavailableError(f"postgres exited with {self.process.returncode}: {self.log_tail()}")
        try:
            with psycopg.connect(self.dsn("postgres"), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def stop(self) -> None:
        """Fast shutdown (SIGINT: roll back open transactions, disconnect clients); SIGKILL if that hangs."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=STOP_TIMEOUT_S)

    def restart(self) -> None:
        """Stop and start again on the same data and port."""
        self.stop()
        self.start()

    def dsn(self, database: str = "postgres") -> str:
        """A connection URL for ``database`` as the superuser ``postgres``."""
        return f"postgresql://postgres@{self.host}:{self.port}/{database}"

    def create_database(self) -> str:
        """A new, empty database with pgvector installed; returns its name."""
        name = f"test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        with psycopg.connect(self.dsn(name), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        return name

    def drop_database(self, name: str) -> None:
        """Drop ``name``, disconnecting whoever still uses it (a worker a failed test left behind)."""
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def log_tail(self, lines: int = 20) -> str:
        """The end of the server's log, for failure messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


@contextlib.contextmanager
def running_postgres(*, host: str = "127.0.0.1") -> Iterator[PostgresServer]:
    """A server in a new temporary directory, stopped and removed on the way out, whatever happened inside."""
    directory = Path(tempfile.mkdtemp(prefix="tasuki-pg-"))  # short: the socket path has a 107-byte limit
    server = PostgresServer(directory, host=host)
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


def _start_or_skip(stack: contextlib.ExitStack) -> PostgresServer:
    try:
        return stack.enter_context(running_postgres())
    except PostgresUnavailableError as exc:
        cannot_run(str(exc))


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """The session's PostgreSQL (one per xdist worker); tests take a database of their own with ``fleet_dsn``."""
    with contextlib.ExitStack() as stack:
        yield _start_or_skip(stack)


@pytest.fixture
def fleet_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    """A connection URL of a database made for this test alone (pgvector installed), dropped after it."""
    name = postgres_server.create_database()
    yield postgres_server.dsn(name)
    postgres_server.drop_database(name)


@pytest.fixture
def private_postgres() -> Iterator[PostgresServer]:
    """A server of this test's own, for tests that stop, kill or restart it."""
    with contextlib.ExitStack() as stack:
        yield _start_or_skip(stack)
