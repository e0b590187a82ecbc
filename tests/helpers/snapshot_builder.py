"""A task's build of an environment in a process of its own, for the snapshot store's cross-process tests.

    python -m tests.helpers.snapshot_builder ROOT KEY HOME CHECKOUT REPORT [--hold-until FILE] [--die-before-rename]
                                             [--spare | --restore]

Under the key's lock it finds the snapshot (reports ``found``) or publishes HOME and CHECKOUT's ``.venv``
(reports ``built``). Before waiting for the lock it tries once without waiting and reports ``waited`` if another
process held it. ``--hold-until``: holding the lock, report ``holding`` and wait for FILE to exist.
``--die-before-rename``: the process kills itself (SIGKILL) at the rename that would publish the snapshot.
Reports are lines appended to REPORT. ``--spare``: instead, make the found snapshot's spare (reports ``spare``).
``--restore``: instead, restore the found snapshot into HOME and CHECKOUT (reports ``restored``). Both are there
for a test to kill the process in the middle.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

from sandbox.snapshots import SnapshotBusy, SnapshotStore
from tests.helpers.context_support import wait_for


def report(path: Path, line: str) -> None:
    with path.open("a") as handle:
        handle.write(line + "\n")


def die_at_rename(source: object, destination: object) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("root", "key", "home", "checkout", "report"):
        parser.add_argument(name)
    parser.add_argument("--hold-until")
    parser.add_argument("--die-before-rename", action="store_true")
    parser.add_argument("--spare", action="store_true")
    parser.add_argument("--restore", action="store_true")
    args = parser.parse_args()
    store = SnapshotStore(Path(args.root), keep_per_repository=3, keep_days=14, max_bytes=1 << 30)
    out = Path(args.report)
    if args.spare or args.restore:
        snapshot = store.find(args.key)
        assert snapshot is not None, "the test publishes the snapshot first"
        if args.spare:
            report(out, f"spare {store.make_spare(snapshot)}")
        else:
            report(out, f"restored {store.restore(snapshot, Path(args.home), Path(args.checkout))}")
        return
    try:
        with store.building(args.key, timeout=0):
            pass
    except SnapshotBusy:
        report(out, "waited")
    with store.building(args.key):
        if args.hold_until:
            report(out, "holding")
            wait_for(lambda: Path(args.hold_until).exists(), timeout=120, what="the test's go-ahead")
        if store.find(args.key) is not None:
            report(out, "found")
            return
        if args.die_before_rename:
            os.rename = die_at_rename  # type: ignore[assignment]  # the crash lands between the copy and the rename
        store.publish(args.key, "owner/repo", Path(args.home), Path(args.checkout), [".venv"], [], time.time())
        report(out, "built")


if __name__ == "__main__":
    main()
