"""One clock decides staleness (issue 26, point 4): real workers and a real monitor whose clocks are minutes
off (``faketime``), real Redis, the scripted model.  A healthy task on a worker two minutes behind, watched by
a monitor two minutes ahead, is never taken from it; a worker two minutes ahead that dies has its task
resumed as soon as its heartbeat is stale by Redis's clock, not two minutes later."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid as uuid_module
from datetime import datetime
from pathlib import Path

import pytest
import redis

from tests.helpers.beat_process import BeatProcess
from tests.helpers.celery_worker import REPO_ROOT, WorkerProcess, worker_env
from tests.helpers.faketime import faketime_env, require_libfaketime
from tests.helpers.stack import Stack, local_request, make_buggy_repo
from tests.helpers.worker_scenarios import running_stack, worker_logs
from tests.test_monitor_chaos import MONITOR_ENV, assert_one_history, mid_task_on, sleepy_turns
from worker.names import TASKS_QUEUE

pytestmark = pytest.mark.integration

SKEW = "120"  # seconds: the two minutes
# A resume that waited for a two-minute skew to pass could not finish inside this; one judged by Redis's
# clock comes after stale_after_s (3 s) and a monitor pass (1 s).
PROMPT_S = 60.0


def skewed(stack: Stack, offset: str) -> dict[str, str]:
    """The stack's environment with this process's wall clock moved by ``offset`` seconds (``+120``, ``-120``)."""
    return faketime_env(stack.env(), offset)


def send_task(stack: Stack, root: Path, n: int) -> str:
    """Task ``n`` on its own repository, with its own prompt (so its own conversation with the model)."""
    return stack.send(local_request(make_buggy_repo(root / f"repo{n}"), prompt=f"Task {n}: fix calc.", task_id=str(n)))


def start(stack: Stack, name: str, env: dict[str, str], **kwargs: str) -> WorkerProcess:
    worker = WorkerProcess(name, env, stack.root / f"{name}.log", **kwargs).start()  # type: ignore[arg-type]
    stack.workers.append(worker)
    return worker


def test_skewed_clocks_fail_no_healthy_task_and_a_dead_workers_task_resumes_promptly(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    require_libfaketime()
    entries = sleepy_turns(30, 0.5)  # long enough that the slow-clocked worker is still busy with the first task
    # when the second is sent (so the second goes to the worker ahead), and for many monitor passes
    with running_stack(tmp_path, redis_url, entries, env=MONITOR_ENV) as (stack, server):
        ahead = skewed(stack, f"+{SKEW}")
        start(stack, "maint", ahead, queues="maintenance,compression", pool="solo")  # the monitor runs here
        # The beat only sends the schedule; libfaketime makes celery beat's sleep fail (EINVAL), so it keeps time.
        beat = BeatProcess("beat", stack.env(), tmp_path).start()
        try:
            behind = start(stack, "behind", skewed(stack, f"-{SKEW}"), queues="tasks")
            healthy = send_task(stack, tmp_path, 0)
            stack.wait_until(lambda: mid_task_on(stack, [healthy], behind), what="a task on the slow clock")
            doomed_worker = start(stack, "ahead", ahead, queues="tasks")
            doomed = send_task(stack, tmp_path, 1)
            stack.wait_until(lambda: mid_task_on(stack, [doomed], doomed_worker, min_steps=1), what="a task ahead")
            doomed_worker.kill()
            start(stack, "rescuer", stack.env(), queues="tasks")
            stack.wait_finished(doomed, PROMPT_S)
            stack.wait_finished(healthy, 120.0)
            resumed = assert_one_history(stack, server, doomed, len(entries))
            kept = assert_one_history(stack, server, healthy, len(entries))
            logs = worker_logs(stack)
        finally:
            beat.stop()
    assert (kept["status"], kept["attempt"]) == ("completed", 1)  # never taken from its slow-clocked worker
    assert (resumed["status"], resumed["attempt"]) == ("completed", 2)
    assert "lock taken over" not in logs
    assert "this host's clock is 120.0s behind Redis's" in logs  # each skewed process said so at start
    assert "this host's clock is 120.0s ahead of Redis's" in logs


def test_a_delivery_sent_again_from_a_host_minutes_ahead_is_due_by_redis_clock_not_its_own(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    """A deferred or handed-back delivery is sent again with a delay; a worker runs it once the message's ``eta``
    has passed by its own clock. Stamped with the sender's clock, a retry sent from a host five minutes ahead waited
    five minutes on every host that keeps time; stamped with Redis's, it is due when it should be."""
    require_libfaketime()
    uuid, delay_s = str(uuid_module.uuid4()), 60
    config = tmp_path / "config.yaml"
    config.write_text("")
    env = faketime_env(worker_env({"TASUKI_CONFIG": str(config), "TASUKI__BROKER__URL": redis_url}), f"+{SKEW}")
    send = (
        "import sys; from worker.runtime import CLOCK, redis_client; from worker.tasks import requeue; "
        "CLOCK.measure(redis_client()); requeue(sys.argv[1], {'task_key': {}, 'user': 'u'}, float(sys.argv[2]))"
    )
    done = subprocess.run([sys.executable, "-c", send, uuid, str(delay_s)], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    headers = [json.loads(raw)["headers"] for raw in redis_client.lrange(TASKS_QUEUE, 0, -1)]
    eta = next(h["eta"] for h in headers if h["id"] == uuid)
    seconds, micros = redis_client.time()
    due_in = datetime.fromisoformat(eta).timestamp() - (seconds + micros / 1e6)
    assert 0 < due_in <= delay_s  # by the sender's own clock it would be due in delay_s + SKEW
