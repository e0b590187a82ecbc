"""A holder paused at random points between its fencing check and its write never writes after a takeover.

A real writer process appends in a tight loop; the test stops it (SIGSTOP) at a random point, hundreds of
times, lets another process take the context over, then continues it (SIGCONT).  Counted over every trial:
records of the paused holder after the takeover, duplicate ``seq`` numbers, ``state.json`` overwritten by
the paused holder while the taker held it, and takeovers that failed.  Each must be 0 (docs/fencing.md).
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import uuid as uuid_module
from pathlib import Path
from typing import IO, Any

from contexts import jsonl
from contexts.names import MESSAGES_FILE, RUNNING_DIR, TOOLS_FILE
from tests.helpers.context_support import (
    every_context_is_valid,  # noqa: F401 - autouse: checks what each test left
    wait_for,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
TRIALS = int(os.environ.get("TASUKI_FENCE_TRIALS", "300"))


class Lines:
    """A child's stdout, one line at a time, read by a thread so that waiting has a deadline."""

    def __init__(self, stream: IO[str]) -> None:
        self.queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self.queue.put(line.strip())

    def next(self, timeout: float = 60.0) -> str:
        return self.queue.get(timeout=timeout)

    def until(self, expected: str, timeout: float = 60.0) -> None:
        while (line := self.next(timeout)) != expected:
            assert not line.startswith("Traceback"), line


def spawn(role: str, base: Path, uuid: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.fence_race", role, str(base), uuid],
        cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )


def stopped(pid: int) -> bool:
    """Every thread of ``pid`` is stopped (the state letter of /proc/PID/stat is T)."""
    tasks = os.listdir(f"/proc/{pid}/task")
    return all(Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T" for t in tasks)


def ask(taker: subprocess.Popen[str], lines: Lines, command: str) -> dict[str, Any]:
    assert taker.stdin is not None
    taker.stdin.write(command + "\n")
    taker.stdin.flush()
    answer: dict[str, Any] = json.loads(lines.next())
    return answer


def audit(context: Path) -> dict[str, int]:
    """Stale records (a writer record of acquisition <= the latest takeover before it) and duplicate seqs."""
    counts = {"stale_appends": 0, "duplicate_seqs": 0, "records": 0}
    for name in (MESSAGES_FILE, TOOLS_FILE):
        latest_takeover = 0
        seqs = []
        for record in jsonl.iter_records(context / name):
            seqs.append(record["seq"])
            latest_takeover = max(latest_takeover, int(record.get("takeover", 0)))
            written_by = record.get("writer_acquisition")
            if written_by is not None and written_by <= latest_takeover:
                counts["stale_appends"] += 1
        counts["duplicate_seqs"] += len(seqs) - len(set(seqs)) + (seqs != sorted(seqs))
        counts["records"] += len(seqs)
    return counts


def test_a_holder_paused_between_check_and_write_never_writes_after_a_takeover(tmp_path: Path) -> None:
    rng = random.Random(26)  # noqa: S311 - a reproducible schedule, not a secret
    base, uuid = tmp_path / "contexts", str(uuid_module.uuid4())
    messages = base / RUNNING_DIR / uuid / MESSAGES_FILE
    writer, taker = spawn("writer", base, uuid), spawn("taker", base, uuid)
    assert writer.stdout is not None
    assert taker.stdout is not None
    written, answers = Lines(writer.stdout), Lines(taker.stdout)
    counts = {"trials": TRIALS, "stale_state_overwrites": 0, "failed_takeovers": 0}
    failures: list[str] = []
    try:
        acquisition = 1
        for _trial in range(TRIALS):
            written.until(f"acquired {acquisition}")
            start = messages.stat().st_size
            threshold = start + rng.randrange(0, 20_000)  # a random point in the writer's loop
            wait_for(lambda t=threshold: messages.stat().st_size >= t, timeout=60, what="the writer to write")
            os.kill(writer.pid, signal.SIGSTOP)
            wait_for(lambda: stopped(writer.pid), timeout=30, what="the writer to stop")
            took = ask(taker, answers, f"take {acquisition}")
            os.kill(writer.pid, signal.SIGCONT)
            if not took["ok"]:  # the context may be left to nobody: stop here and report
                counts["failed_takeovers"] += 1
                failures.append(took["error"])
                break
            written.until(f"fenced {acquisition}")
            released = ask(taker, answers, f"release {acquisition}")
            assert released["ok"], released
            counts["stale_state_overwrites"] += released["holder"] != f"taker:{acquisition}"
            acquisition += 1
    finally:
        writer.kill()
        writer.wait()
        if taker.stdin is not None:
            taker.stdin.close()
        taker.wait(timeout=30)
    counts.update(audit(base / RUNNING_DIR / uuid))
    print("fence race:", json.dumps(counts))
    zero = {k: counts[k] for k in ("stale_appends", "duplicate_seqs", "stale_state_overwrites", "failed_takeovers")}
    assert zero == dict.fromkeys(zero, 0), (counts, failures[:3])
    assert counts["records"] > TRIALS  # the writer really wrote between the pauses
