"""One contender of the lock race: creates, opens and takes over one context until a deadline.

Usage: ``python -m tests.helpers.lock_race_worker '<json arguments>'`` (see ``RaceArgs``).  Each holder
enters an outside witness (a file created with ``O_EXCL``) while it believes it holds the lock; failing
to enter means two holders at once, a violation.  It prints one JSON line of counters at the end.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, TypedDict

from contexts import (
    Context,
    ContextExistsError,
    ContextNotFoundError,
    ContextStore,
    FencedError,
    LockHeldError,
)
from tests.helpers.context_support import CONFIG, TASK_KEY


class RaceArgs(TypedDict):
    base_dir: str
    uuid: str
    witness: str
    ready: str  # this worker creates it once imported and set up
    go: str  # the parent creates it to start every worker at once
    hostname: str
    seed: int
    run_s: float
    stale_after_s: float
    heartbeat_interval_s: float
    detach_probability: float


def try_acquire(store: ContextStore, uuid: str, rng: random.Random) -> tuple[Context | None, bool]:
    """Create the context or open it (taking it over when stale); ``(None, _)`` when someone else has it."""
    create = rng.random() < 0.3
    try:
        if create:
            return store.create(TASK_KEY, CONFIG, uuid=uuid), True
        return store.open(uuid), False
    except (ContextExistsError, ContextNotFoundError, LockHeldError):
        return None, create


def enter_witness(path: str, me: str) -> str | None:
    """Enter the witness; on failure return who is inside (a second holder: a violation)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        try:
            return Path(path).read_text() or "(someone)"
        except FileNotFoundError:
            return "(someone who just left)"
    os.write(fd, me.encode())
    os.close(fd)
    return None


def race(args: RaceArgs) -> dict[str, Any]:
    rng = random.Random(args["seed"])  # noqa: S311 - a reproducible schedule, not a secret
    me = f"{args['hostname']}:{os.getpid()}"
    store = ContextStore(
        args["base_dir"],
        hostname=args["hostname"],
        stale_after_s=args["stale_after_s"],
        heartbeat_interval_s=args["heartbeat_interval_s"],
        fsync="never",
    )
    counts: dict[str, Any] = {
        "acquisitions": 0,
        "creates": 0,
        "takeovers": 0,
        "appended": 0,
        "fenced": 0,
        "releases": 0,
        "detaches": 0,
        "attempts": 0,
        "violations": [],
    }
    Path(args["ready"]).touch()
    while not os.path.exists(args["go"]):
        time.sleep(0.005)
    deadline = time.monotonic() + args["run_s"]
    while time.monotonic() < deadline:
        counts["attempts"] += 1
        ctx, created = try_acquire(store, args["uuid"], rng)
        if ctx is None:
            time.sleep(rng.uniform(0.001, 0.01))  # back off: don't starve the holder's heartbeat of the mutex
            continue
        counts["acquisitions"] += 1
        counts["creates"] += created
        counts["takeovers"] += ctx.previous_holder is not None
        inside = enter_witness(args["witness"], me)
        if inside is not None:
            counts["violations"].append(f"{me} acquired while {inside} was holding")
        try:
            ctx.append_message("assistant", f"{me} holds it (acquisition {counts['acquisitions']})")
            counts["appended"] += 1
        except FencedError:
            counts["fenced"] += 1
        if inside is None:
            os.unlink(args["witness"])
        if created or rng.random() < args["detach_probability"]:
            ctx.detach()  # abandon the lock as a crashed worker would; the creator always does: a takeover
            counts["detaches"] += 1
        else:
            ctx.release()
            counts["releases"] += 1
    return counts


if __name__ == "__main__":
    print(json.dumps(race(json.loads(sys.argv[1]))), flush=True)
