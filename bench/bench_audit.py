"""``tasuki audit`` at 1,000,000 lines against 1,000 (issue 40). Each view is timed as the command makes it
(``cli.audit.cmd_audit`` on the settings, its output printed into memory), on both logs in turns:

- the default view, the newest 100 events (read from the end of the file): target at most 2 times;
- ``--since`` a time with 50 events after it, all of them (``--limit 0``: bisected to the first): at most 2 times;
- ``--actor`` one person and ``--action`` one action, the newest 100 of theirs: a scan from the end until 100 are
  found (a line is parsed only when its bytes hold both words), for information — it grows with how rare the pair is;
- ``--verify``: every line's hash, for information — it reads everything by nature (its time per million lines is
  printed).

Both logs are one year of events of 50 people and the 13 actions, in time order, each line made by the writer's own
:func:`contexts.audit.chain` (masking, hash, link) and written in one go rather than through a million locked,
fsynced appends, which would only make the setup slow.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.common import Result, standalone, timed
from cli.audit import cmd_audit
from contexts.audit import AUDIT_FILE, GENESIS, HEAD_FILE, Event, audit_dir, chain, encode
from contexts.clock import iso
from worker.audit import ACTIONS
from worker.settings import load_settings
from worker.settings_models import Settings

SMALL = 1_000
FULL_BIG = 1_000_000
QUICK_BIG = 20_000
TARGET = 2.0
START = datetime(2026, 1, 1, tzinfo=UTC)
YEAR_S = 365 * 24 * 3600
PEOPLE = [f"github:person{n}" for n in range(25)] + [f"oidc:person{n}@example.com" for n in range(25)]
ACTION_LIST = sorted(ACTIONS)
RARE_ACTOR, RARE_ACTION = PEOPLE[7], "task.cancel"


def fill(contexts_root: Path, count: int) -> datetime:
    """``count`` chained events over a year, written as the file and its head; returns the time 50 lines before
    the end (what ``--since`` is given)."""
    directory = audit_dir(contexts_root)
    directory.mkdir(parents=True, mode=0o700)
    prev, since = GENESIS, START
    step = YEAR_S / count
    with (directory / AUDIT_FILE).open("wb") as handle:
        for n in range(count):
            at = START + timedelta(seconds=n * step)
            event = Event(at=at, actor=PEOPLE[n % len(PEOPLE)], action=ACTION_LIST[(n // 3) % len(ACTION_LIST)],
                          target=f"github/acme/repo{n % 20}#{n % 997}", source="bench",
                          reason="" if n % 5 else "read permission", outcome="refused" if n % 5 == 0 else "ok",
                          detail={"delivery": f"d-{n}"})
            line = chain(event, seq=n + 1, prev=prev, at=iso(at))
            handle.write(encode(line) + b"\n")
            prev = line["hash"]
            if n == count - 50:
                since = at
    (directory / HEAD_FILE).write_text(json.dumps({"seq": count, "hash": prev}))
    return since


def settings_for(contexts_root: Path) -> Settings:
    empty = contexts_root.parent / "empty.yaml"
    empty.write_text("")
    return load_settings(config_path=empty, env={"TASUKI__CONTEXTS__BASE_DIR": str(contexts_root)})


def command(settings: Settings, **options: object) -> Callable[[], int]:
    """``tasuki audit`` with ``options``, printing into memory; fails loudly on a non-zero exit."""
    args = argparse.Namespace(**{"since": None, "actor": None, "action": None, "limit": 100, "json": False,
                                 "verify": False, **options})

    def run() -> int:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = cmd_audit(args, settings)
        assert code == 0, f"tasuki audit {options} exited {code}"
        return code

    return run


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Each view on both logs, alternately; the ratio of the medians."""
    big = QUICK_BIG if quick else FULL_BIG
    started = time.perf_counter()
    sides = {}
    for count in (SMALL, big):
        root = scratch / f"log-{count}" / "contexts"
        since = fill(root, count)
        sides[count] = (settings_for(root), since)
    size = (audit_dir(scratch / f"log-{big}" / "contexts") / AUDIT_FILE).stat().st_size
    print(f"audit: wrote {SMALL:,} and {big:,} lines ({size / 1e6:.0f} MB) in {time.perf_counter() - started:.1f} s",
          flush=True)
    os.sync()  # the written file's pages go to disk now, not in the background during the first view's timing
    views: list[tuple[str, Callable[[Settings, datetime], dict[str, object]], float | None, int]] = [
        ("newest 100", lambda s, t: {}, TARGET, 21),
        ("--since (50 lines)", lambda s, t: {"since": t.isoformat(), "limit": 0}, TARGET, 21),
        ("--actor --action", lambda s, t: {"actor": RARE_ACTOR, "action": RARE_ACTION}, None, 3 if quick else 5),
        ("--verify", lambda s, t: {"verify": True}, None, 3),
    ]
    results = []
    for name, options, target, rounds in views:
        times: dict[int, list[float]] = {SMALL: [], big: []}
        for round_ in range(rounds + 1):
            order = list(sides.items()) if round_ % 2 else list(reversed(sides.items()))
            for count, (settings, since) in order:
                took = timed(command(settings, **options(settings, since)))
                if round_:  # the first round warms both up
                    times[count].append(took)
        small_s, big_s = statistics.median(times[SMALL]), statistics.median(times[big])
        ratio = big_s / small_s
        print(f"audit: {name} at {big:,} lines {big_s * 1e3:.2f} ms vs {small_s * 1e3:.2f} ms at {SMALL:,}: "
              f"{ratio:.2f}", flush=True)
        if name == "--verify":
            print(f"audit: --verify reads {big / big_s / 1e3:,.0f} thousand lines a second", flush=True)
        results.append(Result(f"audit {name}, {big:,} vs {SMALL:,}", f"{ratio:.2f}",
                              f"<= {target:g}" if target else "-", ratio <= target if target else None))
    return results


if __name__ == "__main__":
    standalone(run, __doc__)
