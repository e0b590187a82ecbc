"""Many processes race to create, open and take over one context; an outside witness sees one holder at a time."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid as uuid_module
from pathlib import Path

from contexts import ContextStore
from tests.helpers.context_support import (
    every_context_is_valid,  # noqa: F401 - autouse: checks what each test left
    shifted_clock,
    wait_for,
)
from tests.helpers.lock_race_worker import RaceArgs
from tests.helpers.schemas import validate_context_dir

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKERS = 8


def test_racing_processes_never_hold_the_same_context_at_once(tmp_path: Path) -> None:
    uuid = str(uuid_module.uuid4())
    base = tmp_path / "contexts"
    go = tmp_path / "go"
    workers = []
    for number in range(WORKERS):
        args: RaceArgs = {
            "base_dir": str(base),
            "uuid": uuid,
            "witness": str(tmp_path / "witness"),
            "ready": str(tmp_path / f"ready-{number}"),
            "go": str(go),
            "hostname": f"host-{number}",  # staleness depends on the heartbeat only, as across hosts
            "seed": number,
            "run_s": 7.0,
            "stale_after_s": 0.75,
            "heartbeat_interval_s": 0.02,
            "detach_probability": 0.1,
        }
        workers.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.helpers.lock_race_worker", json.dumps(args)],
                cwd=REPO_ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        wait_for(
            lambda: all((tmp_path / f"ready-{n}").exists() or w.poll() is not None for n, w in enumerate(workers)),
            timeout=60,
            what="every worker to be ready",
        )
        go.touch()
        results = []
        for worker in workers:
            out, err = worker.communicate(timeout=120)
            assert worker.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()

    violations = [v for r in results for v in r["violations"]]
    total = {key: sum(r[key] for r in results) for key in ("acquisitions", "creates", "takeovers", "appended")}
    assert violations == [], (violations, total)
    assert total["acquisitions"] >= 20, total
    assert total["creates"] == 1, total
    assert total["takeovers"] >= 1, total  # stale locks were taken over during the race, not only free ones
    assert sum(1 for r in results if r["acquisitions"]) >= 2, results

    # Every write of every holder is in the file, numbered 1..n without a gap or a repeat.
    later = ContextStore(base, hostname="auditor", stale_after_s=60, clock=shifted_clock(120))
    ctx = later.open(uuid, heartbeat=False)
    seqs = [m["seq"] for m in ctx.messages()]
    assert seqs == list(range(1, total["appended"] + 1))
    assert ctx.read_state()["attempt"] == total["acquisitions"] + 1  # one per open, none lost
    ctx.release()
    validate_context_dir(ctx.path)
