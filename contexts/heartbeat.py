"""The heartbeat thread: keeps a held context's ``.lock`` fresh while LLM calls and tools run."""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

from contexts.errors import FencedError

log = structlog.get_logger(__name__)


class Heartbeat(threading.Thread):
    """Calls ``beat`` every ``interval_s`` until stopped or fenced; other errors are logged and retried."""

    def __init__(self, uuid: str, interval_s: float, beat: Callable[[], None]) -> None:
        super().__init__(name=f"heartbeat-{uuid[:8]}", daemon=True)
        self.uuid = uuid
        self.interval_s = interval_s
        self._beat = beat
        self._stopped = threading.Event()
        self.fenced = False

    def run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            try:
                self._beat()
            except FencedError:
                self.fenced = True
                log.error("heartbeat stopped: lock taken over", uuid=self.uuid)
                return
            except Exception as exc:  # a full disk or a Redis blip must not kill the heartbeat
                log.warning("heartbeat failed", uuid=self.uuid, error=str(exc))

    def stop(self) -> None:
        """Stop beating and wait for the thread (unless called from the thread itself)."""
        self._stopped.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=10)
