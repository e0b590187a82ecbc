"""The throughput baseline: a bare Celery app with one no-op task and Tasuki's delivery settings.

``celery -A bench.noop_app -b URL --result-backend URL worker -Q noop``; late acks and one prefetched
message per process, like Tasuki's worker, so the baseline pays for the same broker round trips.
"""

from __future__ import annotations

from celery import Celery

NOOP = "bench.noop"
NOOP_QUEUE = "noop"

app = Celery("bench_noop")
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_track_started=True,
    task_send_sent_event=True,
    worker_send_task_events=True,
    task_default_queue=NOOP_QUEUE,
)


@app.task(name=NOOP)
def noop(uuid: str, request: dict[str, object]) -> dict[str, str]:
    """Take the same arguments as ``tasuki.run_task`` and do nothing."""
    return {"uuid": uuid, "status": "completed"}
