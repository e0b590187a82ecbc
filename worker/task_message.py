"""The ``tasuki.run_task`` message as the broker holds it, built without sending it (SPEC §2, §8).

The intake pushes this message itself, in the same Redis round trip that dedupes the delivery and claims the
task key (worker/admission.py). It is the message ``send_run_task`` has Celery push (tests/test_intake_admission.py
compares them field by field), so an unmodified ``celery worker`` consumes it: Celery's own
``app.amqp.create_task_message`` (protocol 2, ``as_task_v2``) builds headers, properties and body; the envelope
around them is what kombu's ``Producer.publish`` → ``Channel.prepare_message`` → ``basic_publish``
(``_inplace_augment_message``) → Redis ``Channel._put`` make of it: the body serialized and base64-encoded, the
routing in ``delivery_info``, a delivery tag, JSON, LPUSHed to the queue's list (priority 0 and no compression,
as Tasuki sends it). What ``send_task`` adds on top and the intake does not want: a result-backend SUBSCRIBE per
task (nobody waits on a ``run_task`` result; ``AsyncResult(uuid).state`` still reads the stored result) and a
``task-sent`` event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from kombu.entity import maybe_delivery_mode
from kombu.serialization import dumps
from kombu.transport.redis import Channel as RedisChannel
from kombu.utils import uuid as delivery_tag
from kombu.utils.json import dumps as json_dumps

from contexts.masking import mask_value
from worker.names import RUN_TASK, TASKS_QUEUE

ARGSREPR_LIMIT = 1024  # Celery's (``app.amqp.argsrepr_maxsize``)


@dataclass(frozen=True)
class QueuedMessage:
    """A task message ready for the broker: the Redis list it goes to and the text to LPUSH there."""

    queue_key: str
    payload: str


def masked_request(request: dict[str, Any]) -> dict[str, Any]:
    """The request as it may be kept in Redis and shown by Flower: masked, except the local ``repo_path``.

    Issue text is untrusted input that may carry a token (the context records the request masked anyway). A
    local ``repo_path`` is a path on the worker's host, kept as it is so that the clone finds it.
    """
    masked = cast(dict[str, Any], mask_value({k: v for k, v in request.items() if k != "repo_path"}))
    if "repo_path" in request:
        masked["repo_path"] = request["repo_path"]
    return masked


def run_task_arguments(uuid: str, request: dict[str, Any]) -> tuple[list[Any], dict[str, str]]:
    """The arguments of ``tasuki.run_task(uuid, request)`` and how Flower and the worker's log show them, the
    same for every sender.

    The shown form is ``repr`` cut to Celery's limit: Celery's own ``saferepr`` of a webhook's request took a
    fifth of the intake's time per delivery (bench/bench_webhook.py under py-spy). ``send_task`` takes these as
    options, and puts them in the message's properties as well as its headers.
    """
    args = [uuid, masked_request(request)]
    shown = repr(args)
    if len(shown) > ARGSREPR_LIMIT:
        shown = shown[: ARGSREPR_LIMIT - 3] + "..."
    return args, {"argsrepr": shown, "kwargsrepr": "{}"}


def run_task_message(app: Any, uuid: str, request: dict[str, Any], *, countdown_s: float | None = None
                     ) -> QueuedMessage:
    """``tasuki.run_task(uuid, request)`` for the tasks queue, as ``send_task`` pushes it for ``send_run_task``."""
    args, shown = run_task_arguments(uuid, request)
    headers, properties, body, _ = app.amqp.create_task_message(
        uuid, RUN_TASK, args, None, countdown=countdown_s or None, reply_to=app.thread_oid,
        create_sent_event=False, ignore_result=None, **shown,
    )
    content_type, content_encoding, data = dumps(body, serializer=app.conf.task_serializer)
    envelope = {
        "body": RedisChannel.codecs[RedisChannel.body_encoding].encode(data),
        "content-encoding": content_encoding,
        "content-type": content_type,
        "headers": headers,
        "properties": {
            **properties,
            **shown,
            "delivery_mode": maybe_delivery_mode(app.conf.task_default_delivery_mode),
            "delivery_info": {"exchange": "", "routing_key": TASKS_QUEUE},  # the direct queue, as Celery routes it
            "priority": 0,  # the lowest priority step: the plain list, not a ``tasks\x06\x16N`` one
            "body_encoding": RedisChannel.body_encoding,
            "delivery_tag": delivery_tag(),
        },
    }
    return QueuedMessage(TASKS_QUEUE, json_dumps(envelope))
