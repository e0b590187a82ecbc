"""``tasuki up``: everything on one machine in one process group (SPEC §10, §11)."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack

from cli.console_access import console_access
from cli.demo import data_line
from cli.embedded import EmbeddedRedis, record_broker, redis_answers
from cli.services import (
    NAME_OPTIONS,
    TASK_QUEUES,
    Service,
    beat_argv,
    child_env,
    maintenance_argv,
    option_value,
    stop_all,
    stop_on_signals,
    until_one_exits,
    worker_processes,
)
from contexts.errors import TasukiError
from contexts.masking import mask
from worker.settings_models import Settings

READY_DEADLINE_S = 180.0  # how long ``up`` waits for its workers to answer before it says "running" anyway
PING_TIMEOUT_S = 1.0  # each ping's wait for replies (the poll's own pace)


def run_up(settings: Settings, say: Callable[[str], None], *, beat: bool = True, webhook: bool = True,
           host: str = "127.0.0.1") -> int:
    """Start Redis if needed, a worker, the beat and the webhook intake (bound to ``host``, with the console on);
    stop them all on Ctrl-C, SIGTERM or SIGHUP, or as soon as one of them dies (saying which, its exit code and
    its last lines)."""
    var_dir = settings.local.var_dir
    lock = threading.Lock()

    def tell(line: str) -> None:  # services print from their own threads
        with lock:
            say(line)

    stopping = threading.Event()
    with ExitStack() as stack, stop_on_signals(stopping):
        overrides: dict[str, str] = {}
        tell(data_line(settings).replace("data:    ", "data:       ", 1))
        if settings.source.sets("broker", "url"):
            shown = mask(settings.broker.url)
            if not redis_answers(settings.broker.url):
                raise TasukiError(f"the configured broker.url {shown} does not answer; start that Redis, or unset "
                                  "broker.url and TASUKI__BROKER__URL for an embedded one")
            tell(f"broker:     the configured Redis at {shown} (broker.url)")
        else:
            # Nobody chose a broker: an embedded one of this data directory's own, never whatever Redis happens to
            # answer on localhost:6379 (on a shared machine, someone else's).
            embedded = EmbeddedRedis(var_dir / "redis").start()
            stack.callback(embedded.stop)
            stack.enter_context(record_broker(var_dir, embedded.url))
            overrides["TASUKI__BROKER__URL"] = embedded.url
            tell(f"broker:     embedded Redis at {embedded.url} (no broker.url configured; data in "
                 f"{embedded.data_dir}; other tasuki commands with this configuration find it)")
        if webhook:
            access = console_access(settings, host)
            overrides.update({"TASUKI__CONSOLE__ENABLED": "true", "TASUKI__WEBHOOK__HOST": host, **access.env})
            shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # noqa: S104 - what the operator chose
            tell(f"console:    http://{shown}:{settings.webhook.port}/console/ ({access.hint})")
        services = _services(child_env(overrides), tell, beat=beat, webhook=webhook, settings=settings)
        stack.callback(stop_all, services)
        for service in services:
            service.start()
            tell(f"{service.name + ':':<11} pid {service.process.pid if service.process else '?'}")
        broker_url = overrides.get("TASUKI__BROKER__URL", settings.broker.url)
        _await_workers(broker_url, services, stopping, tell)
        tell(f"running ({settings.source.describe()}); Ctrl-C stops everything")
        return until_one_exits(services, stopping, tell)


def _await_workers(broker_url: str, services: list[Service], stopping: threading.Event,
                   tell: Callable[[str], None]) -> None:
    """Wait until each Celery process started here answers a ping on the broker, so that "running" means a task
    submitted now is taken at once (a worker's start took 10 s on a loaded 2-core machine, and the first task waited
    it out in the queue). Gives up after :data:`READY_DEADLINE_S`, saying so; returns at once when a service died
    (the caller says which) or on Ctrl-C."""
    from celery import Celery  # the CLI's own probe: no task of Tasuki's is sent
    from kombu.exceptions import OperationalError

    host = socket.gethostname()
    names = (option_value(service.argv, NAME_OPTIONS) for service in services)  # the Celery workers' -n
    expected = {name.replace("%h", host) for name in names if name}
    if not expected:
        return
    started = time.monotonic()
    probe = Celery("tasuki-up", broker=broker_url)
    try:
        while time.monotonic() - started < READY_DEADLINE_S and not stopping.is_set():
            if any(not service.alive() for service in services):
                return
            try:
                replies = probe.control.ping(timeout=PING_TIMEOUT_S)
            except (OSError, OperationalError) as exc:  # the broker went away: the services say why
                tell(f"workers:    not asked whether they are ready ({mask(str(exc))[:200]})")
                return
            answered = {name for reply in replies for name in reply} & expected
            if answered == expected:
                tell(f"workers:    {len(expected)} ready in {time.monotonic() - started:.1f} s")
                return
        if not stopping.is_set():
            tell(f"workers:    not all ready after {READY_DEADLINE_S:.0f} s; tasks wait in the queue until they are")
    finally:
        probe.close()


def _services(
    env: dict[str, str], say: Callable[[str], None], *, beat: bool, webhook: bool, settings: Settings
) -> list[Service]:
    processes = worker_processes(["-Q", ",".join(TASK_QUEUES)], settings.compression.concurrency)
    services = [Service(name, argv, env, say=say) for name, argv in processes]
    if beat:
        services.append(Service("maintenance", maintenance_argv(), env, say=say))
        services.append(Service("beat", beat_argv(settings.local.var_dir), env, say=say))
    if webhook:
        services.append(Service("webhook", [sys.executable, "-m", "cli.main", "webhook"], env, say=say))
    return services
