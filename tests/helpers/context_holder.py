"""A real process that creates a context and holds it, heartbeating, until it is killed.

Usage: ``python -m tests.helpers.context_holder BASE_DIR UUID HEARTBEAT_INTERVAL_S``.  It appends one
message, so the test can see that it is ready, then blocks forever.
"""

from __future__ import annotations

import sys
import threading

from contexts import ContextStore
from tests.helpers.context_support import CONFIG, TASK_KEY


def main(argv: list[str]) -> None:
    base_dir, uuid, interval = argv[0], argv[1], float(argv[2])
    store = ContextStore(base_dir, heartbeat_interval_s=interval, fsync="never")
    ctx = store.create(TASK_KEY, CONFIG, uuid=uuid)
    ctx.append_message("user", "held by a process that will be killed")
    threading.Event().wait()  # until SIGKILL


if __name__ == "__main__":
    main(sys.argv[1:])
