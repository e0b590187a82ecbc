"""Logging: JSON lines on a pipe, a console view on a terminal, the bound uuid everywhere, secrets masked."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from worker.logging import mask_secrets

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2"  # split so that secret scanners leave this file alone
PRELUDE = """
import logging, structlog
from worker.logging import configure_logging
log = structlog.get_logger("worker.example")
"""


def run_logging(body: str) -> tuple[list[dict[str, Any]], str]:
    """Run `body` in a fresh interpreter with stderr on a pipe; return its stderr as parsed JSON lines."""
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [json.loads(line) for line in done.stderr.splitlines()], done.stderr


def test_lines_on_a_pipe_are_json_with_level_timestamp_logger_and_the_bound_uuid() -> None:
    lines, _ = run_logging("""
        configure_logging()
        structlog.contextvars.bind_contextvars(uuid="7d9c4a52-0000-4000-8000-000000000001")
        log.info("step done", step=3)
    """)
    [line] = lines
    assert line["event"] == "step done"
    assert line["step"] == 3
    assert line["level"] == "info"
    assert line["logger"] == "worker.example"
    assert line["uuid"] == "7d9c4a52-0000-4000-8000-000000000001"
    stamp = datetime.fromisoformat(line["timestamp"])
    assert stamp.utcoffset() == UTC.utcoffset(None)


def test_tokens_are_masked_in_messages_values_nested_values_and_tracebacks() -> None:
    _, raw = run_logging(f"""
        configure_logging(json=True)
        log.info("cloning with {TOKEN}", token="{TOKEN}", headers={{"Authorization": ["token {TOKEN}"]}})
        try:
            raise RuntimeError("push rejected for {TOKEN}")
        except RuntimeError:
            log.exception("push failed")
    """)
    assert TOKEN not in raw
    lines = [json.loads(line) for line in raw.splitlines()]
    assert lines[0]["token"] == "[GITHUB_TOKEN]"
    assert lines[0]["headers"] == {"Authorization": ["token [GITHUB_TOKEN]"]}
    assert "RuntimeError: push rejected for [GITHUB_TOKEN]" in lines[1]["exception"]


def test_stdlib_loggers_such_as_celerys_come_out_as_the_same_json_masked() -> None:
    lines, raw = run_logging(f"""
        configure_logging(json=True)
        structlog.contextvars.bind_contextvars(uuid="u-1")
        logging.getLogger("celery.worker.strategy").warning("Task %s received with {TOKEN}", "tasuki.run_task")
    """)
    assert TOKEN not in raw
    [line] = lines
    assert line["event"] == "Task tasuki.run_task received with [GITHUB_TOKEN]"
    assert (line["logger"], line["level"], line["uuid"]) == ("celery.worker.strategy", "warning", "u-1")


def test_a_task_ending_tasuki_handled_is_one_line_without_a_traceback() -> None:
    # Celery's own tracer, as in the worker: a task raising one of its ``throws`` is logged "raised expected" with the
    # traceback in the record's ``data`` extra; an unexpected error keeps its traceback.
    lines, raw = run_logging("""
        from celery import Celery
        from worker.tasks import TaskEnded
        configure_logging(json=True)
        app = Celery("t", broker="memory://", backend="cache+memory://")

        @app.task(name="t.handled", throws=(TaskEnded,))
        def handled():
            raise TaskEnded("cannot create the context /srv/contexts/running/x: [Errno 30] Read-only file system")

        @app.task(name="t.broken")
        def broken():
            raise KeyError("a bug")

        handled.apply()
        broken.apply()
    """)
    expected = [line for line in lines if "raised expected" in line["event"]]
    assert len(expected) == 1
    assert "Read-only file system" in expected[0]["event"]
    assert "traceback" not in expected[0]["data"]
    assert "exception" not in expected[0]
    assert raw.count("Traceback") >= 1  # the unexpected one keeps it
    [unexpected] = [line for line in lines if "raised unexpected" in line["event"]]
    assert "Traceback" in unexpected["data"]["traceback"]


def test_configuring_twice_still_writes_each_line_once() -> None:
    lines, _ = run_logging("""
        configure_logging(json=True)
        configure_logging(json=True)
        log.info("once")
    """)
    assert [line["event"] for line in lines] == ["once"]


def test_lines_below_the_configured_level_are_dropped() -> None:
    lines, _ = run_logging("""
        configure_logging("WARNING", json=True)
        log.info("chatter")
        logging.getLogger("celery").info("more chatter")
        log.warning("disk almost full")
    """)
    assert [line["event"] for line in lines] == ["disk almost full"]


def test_a_terminal_gets_readable_console_lines_not_json() -> None:
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + f"configure_logging()\nlog.info('hello terminal', token='{TOKEN}')\n"],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=terminal,
    )
    os.close(terminal)
    output = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the terminal closes (EIO) once the process has exited
            break
        if not chunk:
            break
        output += chunk
    os.close(controller)
    assert process.wait(timeout=60) == 0
    text = output.decode()
    assert "hello terminal" in text
    assert "[GITHUB_TOKEN]" in text
    assert TOKEN not in text
    assert not text.lstrip().startswith("{")


def test_mask_secrets_processor_masks_every_value_of_the_event() -> None:
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars, mask_secrets]) as logs:
        structlog.contextvars.bind_contextvars(uuid="u-2")
        try:
            structlog.get_logger().info("calling with sk-" + "x" * 24, args=["--token", TOKEN], attempt=2)
        finally:
            structlog.contextvars.unbind_contextvars("uuid")
    assert logs == [
        {
            "event": "calling with [OPENAI_KEY]",
            "args": ["--token", "[GITHUB_TOKEN]"],
            "attempt": 2,
            "uuid": "u-2",
            "log_level": "info",
        }
    ]
