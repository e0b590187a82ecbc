"""The replay model for tests: in a background thread (in-process tests) or a subprocess (worker processes).

with model_server([{"content": "hi", "tool_calls": [...]}]) as server:   # a ReplayServer
    make_provider("openai", "m", 4096, server.openai_base_url, None)

with model_server_process(write_trajectory(tmp_path / "t.jsonl", entries)) as server:
    ...  # server.url, server.openai_base_url, server.requests()
"""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from replay import ReplayModel, ReplayServer, serve
from replay.trajectory import turns_from_entries

START_TIMEOUT_S = 30.0


def write_trajectory(path: Path, entries: list[dict[str, Any]]) -> Path:
    """Write ``entries`` as a JSONL trajectory file and return its path."""
    path.write_text("".join(json.dumps(entry, ensure_ascii=False) + "\n" for entry in entries), encoding="utf-8")
    return path


@contextmanager
def model_server(
    entries: list[dict[str, Any]], host: str = "127.0.0.1", *, context_window: int | None = None
) -> Iterator[ReplayServer]:
    """A replay server on a free port in this process, stopped on exit; ``context_window``: prompts longer than
    that many tokens are refused as OpenAI refuses them (``context_length_exceeded``)."""
    server = serve(ReplayModel(turns_from_entries(entries), context_window=context_window), host=host, port=0)
    try:
        yield server
    finally:
        server.stop()


def fetch_requests(url: str) -> list[dict[str, Any]]:
    """The request log of the replay server at ``url`` (``GET /_requests``)."""
    response = httpx.get(f"{url}/_requests", timeout=10)
    response.raise_for_status()
    records: list[dict[str, Any]] = response.json()
    return records


def wait_for_request(
    fetch: Callable[[], list[dict[str, Any]]],
    predicate: Callable[[dict[str, Any]], bool],
    timeout_s: float = 30.0,
) -> dict[str, Any]:
    """Poll a request log (``server.requests`` getter or ``lambda: fetch_requests(url)``) until a record matches.

    A request held by a scripted delay shows its ``turn`` with ``status`` still ``None``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        for record in fetch():
            if predicate(record):
                return record
        if time.monotonic() > deadline:
            raise TimeoutError(f"no matching request to the replay model within {timeout_s} s")
        time.sleep(0.02)  # polling interval, bounded by the deadline above


class ModelServerProcess:
    """``python -m replay`` in a child process; its first stdout line is its URL."""

    def __init__(self, trajectory: Path, *, timeout_s: float = START_TIMEOUT_S) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "replay", "--trajectory", str(trajectory), "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            self.url = self._read_url(timeout_s)
        except BaseException:
            self.stop()
            raise
        self.openai_base_url = f"{self.url}/v1"

    def _read_url(self, timeout_s: float) -> str:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if selector.select(timeout=0.2):
                    line = self.process.stdout.readline().strip()
                    if line.startswith("http://"):
                        return line
                    raise RuntimeError(f"replay model printed {line!r} instead of its URL")
                if self.process.poll() is not None:
                    raise RuntimeError(f"replay model exited with {self.process.returncode} before serving")
        raise TimeoutError(f"replay model did not print its URL within {timeout_s} s")

    def requests(self) -> list[dict[str, Any]]:
        """Every request the server has received so far."""
        return fetch_requests(self.url)

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, then SIGKILL if it does not exit in time; return the exit code."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode


@contextmanager
def model_server_process(trajectory: Path) -> Iterator[ModelServerProcess]:
    """A replay server in a subprocess (reachable from other processes), stopped on exit."""
    server = ModelServerProcess(trajectory)
    try:
        yield server
    finally:
        server.stop()


# Two tools in the OpenAI shape, for provider tests that need a small tool list of their own.
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a command in the checkout.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout_s": {"type": "integer"}},
            "required": ["command"],
        },
    },
}
FINISH_TOOL = {
    "type": "function",
    "function": {
        "name": "finish",
        "description": "End the task.",
        "parameters": {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]},
    },
}
