"""Structured logging: one JSON object per line (a readable view on a terminal), secrets always masked.

Modules log with `log = structlog.get_logger(__name__)`; stdlib loggers (Celery's, uvicorn's) go through
the same processors, so every line of a process has one shape and carries the task's bound `uuid`.
"""

from __future__ import annotations

import functools
import json as jsonlib
import logging
import sys

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from contexts.masking import mask_value

__all__ = ["configure_logging", "expected_without_traceback", "mask_secrets"]

_HANDLER_NAME = "tasuki"


def mask_secrets(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Mask tokens, keys and URL credentials in every value of the event (tracebacks included)."""
    return {key: mask_value(value) for key, value in event_dict.items()}


def expected_without_traceback(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Celery's line for a task that raised one of its ``throws`` (an ending Tasuki handled, such as a contexts root
    it cannot write) is one line: the traceback Celery puts in its ``data`` extra is left out (issue 40)."""
    data = event_dict.get("data")
    if isinstance(data, dict) and data.get("description") == "raised expected" and "traceback" in data:
        event_dict["data"] = {key: value for key, value in data.items() if key != "traceback"}
    return event_dict


def _shared_processors() -> list[Processor]:
    """What every line gets, whether it came from structlog or from a stdlib logger."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]


def _renderer(as_json: bool) -> Processor:
    if as_json:
        return structlog.processors.JSONRenderer(serializer=jsonlib.dumps, ensure_ascii=False, default=str)
    return structlog.dev.ConsoleRenderer(colors=False)


@functools.cache
def _configure_structlog() -> None:
    """Hand structlog events to stdlib logging; done once, because loggers cache this on first use."""
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_shared_processors(),
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def configure_logging(level: str | int = "INFO", json: bool | None = None) -> None:
    """Send all logging to stderr as JSON lines (`json=None`: unless stderr is a terminal). Idempotent."""
    _configure_structlog()
    as_json = not sys.stderr.isatty() if json is None else json
    # The stdlib side is rebuilt on each call: replacing our one handler lets a re-call change level or format.
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*_shared_processors(), structlog.stdlib.ExtraAdder(), expected_without_traceback],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            # Tracebacks become text before masking: exception messages can carry tokens too.
            structlog.processors.format_exc_info,
            mask_secrets,
            _renderer(as_json),
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(formatter)

    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    logging.captureWarnings(True)
