"""A checkpoint's push overlapped with the next model call: one push in flight at most, waited for by the next
checkpoint and by the task's end, so pushes reach the remote in order and none is left behind."""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

log = structlog.get_logger(__name__)


class BackgroundPush:
    """Runs one push at a time in a thread; a failed push is tried once more by whoever waits for it."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._push: Callable[[], None] | None = None
        self._error: Exception | None = None

    def start(self, push: Callable[[], None]) -> None:
        """Run ``push`` in the background, after the one in flight (if any) is done."""
        self.wait()
        self._push, self._error = push, None
        self._thread = threading.Thread(target=self._run, name="tasuki-checkpoint-push", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self._push is not None  # noqa: S101 - set by start
        try:
            self._push()
        except Exception as exc:  # handed to the waiter, which retries and raises
            self._error = exc

    def wait(self) -> None:
        """Block until the push in flight is done; a failed one is run again here, and raises if it fails again."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        thread.join()
        push, error, self._push, self._error = self._push, self._error, None, None
        if error is not None and push is not None:
            log.warning("checkpoint push failed; trying again", error=str(error)[:300])
            push()
