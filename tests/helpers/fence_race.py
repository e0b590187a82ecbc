"""The two processes of the fencing race: a writer that appends in a tight loop, and a taker.

``python -m tests.helpers.fence_race writer BASE UUID`` holds the context and writes as fast as it can: a
message on every turn, a tool record on every third, a ``state.json`` write on every fifth, with a heartbeat
thread beating every few milliseconds.  Each record carries the writer's acquisition number ``a``.  It prints
``acquired A`` when it holds the context and ``fenced A`` when it learns it lost it, then takes it again once
it is free.  The test pauses it (SIGSTOP) at random points.

``python -m tests.helpers.fence_race taker BASE UUID`` reads commands on stdin: ``take K`` takes the context
over (its clock is an hour ahead, so the paused writer's lock is stale to it), writes a marker message and
``state.json.holder = "taker:K"``; ``release K`` reads ``state.json`` by the context's public name (a stale
overwrite by the writer would show there), writes a second marker and lets go.  It answers one JSON line per
command.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime, timedelta

from contexts import Context, ContextStore, FencedError, LockHeldError
from contexts.state import read_state
from tests.helpers.context_support import CONFIG, TASK_KEY

STALE_AFTER_S = 30.0  # the writer's own view: the taker's lock (an hour ahead) is never stale to it


def writer(base: str, uuid: str) -> None:
    store = ContextStore(base, hostname="writer", stale_after_s=STALE_AFTER_S, heartbeat_interval_s=0.005,
                         fsync="never")
    ctx: Context | None = store.create(TASK_KEY, CONFIG, uuid=uuid)
    acquisition = 1
    say(f"acquired {acquisition}")
    turn = 0
    while True:
        if ctx is None:
            try:
                ctx = store.open(uuid)
            except LockHeldError:
                time.sleep(0.001)  # the taker holds it; this process only waits for its turn
                continue
            acquisition += 1
            say(f"acquired {acquisition}")
        try:
            turn += 1
            ctx.append_message("assistant", f"writer turn {turn}", writer_acquisition=acquisition)
            if turn % 3 == 0:
                ctx.append_tool("bash", {"turn": turn}, "success", 1, writer_acquisition=acquisition)
            if turn % 5 == 0:
                ctx.update_state(holder=f"writer:{acquisition}", last_activity=f"turn {turn}")
        except FencedError:
            ctx.detach()
            ctx = None
            say(f"fenced {acquisition}")


def taker(base: str, uuid: str) -> None:
    store = ContextStore(base, hostname="taker", stale_after_s=STALE_AFTER_S, fsync="never",
                         clock=lambda: datetime.now(UTC) + timedelta(hours=1))
    held: Context | None = None
    for line in sys.stdin:
        command, trial = line.split()
        try:
            if command == "take":
                held = store.open(uuid, heartbeat=False)
                held.append_message("user", f"takeover {trial}", takeover=int(trial))
                held.update_state(holder=f"taker:{trial}")
                say(json.dumps({"ok": True}))
            elif command == "release" and held is not None:
                holder = read_state(store.running_path(uuid)).get("holder")
                held.append_message("user", f"released {trial}", released=int(trial))
                held.release()
                held = None
                say(json.dumps({"ok": True, "holder": holder}))
        except Exception as exc:  # a failed takeover is what the test counts
            say(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))


def say(text: str) -> None:
    print(text, flush=True)


if __name__ == "__main__":
    {"writer": writer, "taker": taker}[sys.argv[1]](sys.argv[2], sys.argv[3])
