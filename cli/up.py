"""``tasuki up``: everything on one machine in one process group (SPEC §10, §11)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from cli.embedded import EmbeddedRedis, redis_answers
from cli.services import TASK_QUEUES, Service, beat_argv, child_env, maintenance_argv, wait_all, worker_argv
from worker.settings_models import Settings


def run_up(
    settings: Settings, say: Callable[[str], None], *, beat: bool = True, webhook: bool = True,
    var_dir: Path = Path("var"),
) -> int:
    """Start Redis if needed, a worker, the beat and the webhook intake; stop them all on Ctrl-C."""
    with ExitStack() as stack:
        overrides: dict[str, str] = {}
        if redis_answers(settings.broker.url):
            say(f"broker:  Redis at {settings.broker.url}")
        else:
            embedded = EmbeddedRedis(var_dir.absolute() / "redis").start()
            stack.callback(embedded.stop)
            overrides["TASUKI__BROKER__URL"] = embedded.url
            say(f"broker:  embedded Redis at {embedded.url} (data in {embedded.data_dir})")
        env = child_env(overrides)
        services = [Service("worker", worker_argv(["-Q", ",".join(TASK_QUEUES)]), env)]
        if beat:
            services.append(Service("maintenance", maintenance_argv(), env))
            services.append(Service("beat", beat_argv(var_dir.absolute() / "beat"), env))
        if webhook:
            import sys

            argv = [sys.executable, "-m", "cli.main", "webhook"]
            services.append(Service("webhook", argv, env))
        for service in services:
            service.start()
            stack.callback(service.stop)
            say(f"{service.name + ':':<8} pid {service.process.pid if service.process else '?'}")
        say("running; Ctrl-C stops everything")
        try:
            return wait_all(services)
        except KeyboardInterrupt:
            say("stopping ...")
            return 0
