"""Trigger admission with every trigger's permission checked (issue 40), against today's admission without a check.

The intake's own path, in process: ``Intake.deliver`` of a signed-off ``issues.labeled`` trigger for a new issue
each time (the common delivery: dedupe, claim and enqueue in one Redis script), on a private Redis, the blocking
calls on the intake's thread pool as in the app. Four sides, measured in alternating rounds (each side taking
its turn at going first):

- **today**: ``permissions.check: false`` — no lookup (what the intake did before issue 40);
- **warm**: the person's permission cached in Redis — one GET on the event loop before the script (the audit
  line of the admission left out: this side is the check alone);
- **warm + audit**: the same with the admission's audit line (worker/audit.py: a hash-chained line, fsynced, under
  a file lock), written off the answer's path but counted here (each round waits for its lines); for information,
  the audit log's cost is issue 40 item 5's, not the check's;
- **cold**: the cache empty (``permissions.cache_s: 0``) — every delivery asks the fake GitHub over real HTTP
  (``GET /repos/{o}/{r}/collaborators/{user}/permission``) on a worker thread; for information, it is what the
  first trigger of each person costs once per ``cache_s``.

Each figure is the median time per delivery of the rounds; the ratios are warm / today (target ≤ 1.2), warm +
audit / today and cold / today (information). The cold side's time is mostly the fake forge's HTTP (a new client
per lookup, Python's http.server), an upper bound of a real forge's on a LAN, not a measure of it.
"""

from __future__ import annotations

import asyncio
import functools
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import redis
import redis.asyncio
from celery import Celery

from bench.common import Result, standalone
from bench.worker_stack import private_redis
from tests.helpers.deliveries import load_payload
from tests.helpers.fake_forge import FakeForge
from webhooks.events import github_action
from webhooks.intake import Intake
from worker.celery import celery_config
from worker.logging import configure_logging
from worker.names import TASKS_QUEUE
from worker.settings import load_settings
from worker.settings_models import Settings

T = TypeVar("T")
TARGET = 1.2
TOKEN = "bench-permissions-token"  # noqa: S105 - the fake forge's, for this run only
PERSON = "writer"


def _settings(scratch: Path, redis_url: str, api_url: str, **permissions: str) -> Settings:
    env = {"TASUKI__BROKER__URL": redis_url, "TASUKI__CONTEXTS__BASE_DIR": str(scratch / "contexts"),
           "TASUKI__CONTEXTS__WORKSPACES_DIR": str(scratch / "workspaces"),
           "TASUKI__GITHUB__API_URL": api_url, "TASUKI__GITHUB__LABELS__TRIGGER": "bug", "GITHUB_TOKEN": TOKEN,
           **{f"TASUKI__PERMISSIONS__{key.upper()}": value for key, value in permissions.items()}}
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "config.yaml").write_text("")
    return load_settings(config_path=scratch / "config.yaml", env=env)


class Side:
    """One intake (its settings, Redis clients, thread pool) and the issue numbers it has used."""

    def __init__(self, settings: Settings, number_base: int, *, audit: bool = True) -> None:
        self.settings = settings
        self.client = redis.Redis.from_url(settings.broker.url)
        self.async_client = redis.asyncio.Redis.from_url(settings.broker.url)
        self.executor = ThreadPoolExecutor(max_workers=4)
        self.celery = Celery("bench-permissions")
        self.celery.conf.update(celery_config(settings))
        self.intake = Intake(settings, self.client, self.async_client, self.celery, self._blocking)
        self.number = number_base
        if not audit:  # the check alone: this side's admissions are not recorded
            self.intake.gate._audit = lambda *args: None  # type: ignore[method-assign]

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, functools.partial(fn, *args))

    async def round(self, deliveries: int) -> float:
        """Seconds per delivery of ``deliveries`` new-issue triggers, their audit lines written."""
        payload = load_payload("github/issues.labeled.json")
        payload["sender"]["login"] = PERSON
        actions = []
        for _ in range(deliveries):
            self.number += 1
            payload["issue"]["number"] = self.number
            actions.append(github_action("issues", payload, self.settings.github))
        started = time.perf_counter()
        for index, action in enumerate(actions):
            answer = await self.intake.deliver("github", f"bench-{self.number}-{index}", action)
            if answer.status_code != 202:
                raise RuntimeError(f"delivery not admitted: {answer}")
        while self.intake.gate._background:  # the audit lines are part of the admission's cost
            await asyncio.gather(*self.intake.gate._background)
        elapsed = time.perf_counter() - started
        self.client.delete(TASKS_QUEUE)
        return elapsed / deliveries

    async def close(self) -> None:
        sweeper = self.intake.gate._sweeper
        if sweeper is not None:
            sweeper.cancel()
        await self.async_client.aclose()
        self.client.close()
        self.celery.close()
        self.executor.shutdown()


async def _measure(sides: dict[str, Side], rounds: int, deliveries: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in sides}
    for side in sides.values():
        await side.round(5)  # warm-up: connections, scripts loaded, the warm side's cache filled
    names = list(sides)
    for turn in range(rounds):
        for name in names[turn % len(names):] + names[:turn % len(names)]:  # each side takes its turn at going first
            # The cold side asks the forge each time: fewer deliveries say enough.
            times[name].append(await sides[name].round(max(5, deliveries // 10) if name == "cold" else deliveries))
    for side in sides.values():
        await side.close()
    return times


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Alternating rounds of the three sides; the ratios of their medians."""
    rounds, deliveries = (3, 20) if quick else (21, 300)
    configure_logging("WARNING")  # a line per delivery would time the terminal
    with private_redis(scratch / "redis") as redis_url, FakeForge(scratch / "forge", TOKEN).serve() as forge:
        forge.roles[PERSON] = "write"
        sides = {
            "today": Side(_settings(scratch / "today", redis_url, forge.github_api_url, check="false"), 0),
            "warm": Side(_settings(scratch / "warm", redis_url, forge.github_api_url), 1_000_000, audit=False),
            "warm + audit": Side(_settings(scratch / "audit", redis_url, forge.github_api_url), 3_000_000),
            "cold": Side(_settings(scratch / "cold", redis_url, forge.github_api_url, cache_s="0"), 2_000_000,
                         audit=False),
        }
        times = asyncio.run(_measure(sides, rounds, deliveries))
        lookups = sum(1 for r in forge.requests if r["path"].endswith(f"/collaborators/{PERSON}/permission"))
    today, warm, audited, cold = (statistics.median(times[name]) for name in ("today", "warm", "warm + audit",
                                                                               "cold"))
    print(f"permissions: admission of a new issue's trigger, today (no check) {today * 1e6:.0f} µs, warm cache "
          f"{warm * 1e6:.0f} µs, warm with its audit line {audited * 1e6:.0f} µs, cold (the forge asked over HTTP) "
          f"{cold * 1e6:.0f} µs per delivery; {lookups} lookups reached the forge", flush=True)
    for name, figure in (("warm", warm), ("warm + audit", audited), ("cold", cold)):
        print(f"permissions: {name} vs today: {figure / today:.2f}", flush=True)
    return [Result("trigger admission, warm vs today", f"{warm / today:.2f}", f"<= {TARGET:g}", warm / today <= TARGET),
            Result("admission, warm + audit vs today", f"{audited / today:.2f}", "info", None),
            Result("trigger admission, cold vs today", f"{cold / today:.2f}", "info", None)]


if __name__ == "__main__":
    standalone(run, __doc__)
