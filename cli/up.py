"""``tasuki up``: everything on one machine in one process group (SPEC §10, §11)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from contextlib import ExitStack

from cli.console_access import console_access
from cli.demo import data_line
from cli.embedded import EmbeddedRedis, record_broker, redis_answers
from cli.services import (
    TASK_QUEUES,
    Service,
    beat_argv,
    child_env,
    maintenance_argv,
    stop_all,
    stop_on_signals,
    until_one_exits,
    worker_processes,
)
from contexts.errors import TasukiError
from contexts.masking import mask
from worker.settings_models import Settings


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
        tell(f"running ({settings.source.describe()}); Ctrl-C stops everything")
        return until_one_exits(services, stopping, tell)


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
