"""Flower's HTTP API for tests: authenticated reads that poll with a deadline and keep every body they saw."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from cli.services import Service


@dataclass
class FlowerClient:
    """A client of one Flower server; ``bodies`` holds every response body it received, for leak checks."""

    url: str
    user: str
    password: str
    bodies: list[str] = field(default_factory=list)

    def get(self, path: str, *, auth: tuple[str, str] | bool | None = True, **params: Any) -> httpx.Response:
        """GET ``path``; ``auth=True`` sends the configured basic auth, ``None`` sends none."""
        credentials = (self.user, self.password) if auth is True else auth or None
        response = httpx.get(f"{self.url}{path}", auth=credentials, params=params, timeout=10)
        self.bodies.append(response.text)
        return response

    def json(self, path: str, **params: Any) -> Any:
        """The JSON answer of an authenticated GET (raises on an error status)."""
        response = self.get(path, **params)
        response.raise_for_status()
        return response.json()

    def wait_until(self, probe: Callable[[], Any], what: str, process: Service, timeout_s: float = 30.0) -> Any:
        """Poll ``probe`` until it returns something truthy; fail early when Flower exits."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not process.alive():
                raise AssertionError(f"flower exited while waiting for {what}")
            try:
                value = probe()
            except httpx.TransportError:  # not listening yet
                value = None
            if value:
                return value
            time.sleep(0.1)  # polling interval, bounded by the deadline
        raise AssertionError(f"timed out waiting for flower: {what}")

    def worker_online(self, worker: str) -> bool:
        """Whether Flower's event stream has seen ``worker`` come online (its Prometheus gauge is 1)."""
        metrics = self.get("/metrics").text
        return re.search(rf'flower_worker_online\{{worker="{re.escape(worker)}"\}} 1\.0', metrics) is not None

    def task_info(self, task_id: str, state: str) -> dict[str, Any] | None:
        """``/api/task/info/<id>`` once Flower knows the task in ``state``; None before."""
        response = self.get(f"/api/task/info/{task_id}")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        info: dict[str, Any] = response.json()
        return info if info.get("state") == state else None
