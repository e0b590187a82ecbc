"""An environment left on a warm copy for the next task of its key (SPEC §17; docs/environments.md "Reused").

A task's restored (or built and kept) environment stays in its working copy when the task ends. The worker records
the key, the checkout paths and their fingerprint (``sandbox.snapshot_files.fingerprint``: every entry's inode,
size, mode and change time) in a file beside its own index of the copy, out of the sandbox's reach, moved with the
copy from task to task. The next task on that copy keeps the paths through git's clean and reuses them when its key
is the same, the key's snapshot is still kept, and the fingerprint is unchanged: then the files are exactly the ones
the restore made, so nothing needs copying. Anything else (another key, no declaration, a file its agent changed,
added or removed) and the paths are deleted before the task's environment is restored or built as usual.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from contexts.errors import BAD_DATA_ERRORS
from sandbox.snapshot_files import fingerprint

FORMAT = 1
_UNREADABLE: tuple[type[Exception], ...] = (*BAD_DATA_ERRORS, OSError)


@dataclass(frozen=True)
class WarmEnvironment:
    """What a working copy holds of its previous task's environment: the key, the snapshot it is a copy of (when
    that was published: a key swept and built again may hold other files), the paths (relative to the checkout)
    and their fingerprint when the copy was made."""

    key: str
    published: float
    paths: tuple[str, ...]
    fingerprint: str

    def unchanged(self, checkout: Path) -> bool:
        """Whether the paths under ``checkout`` are still exactly as they were made (unreadable: changed)."""
        try:
            return fingerprint(checkout, self.paths).digest == self.fingerprint
        except OSError:
            return False


def remember(record: Path, checkout: Path, key: str, published: float, paths: tuple[str, ...]) -> None:
    """Record that ``paths`` of ``checkout`` hold a copy of the snapshot of ``key`` published at ``published``, as
    they are now (before any agent's command)."""
    made = fingerprint(checkout, paths)
    record.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = record.with_name(f".{record.name}.{secrets.token_hex(4)}")
    data = {"format": FORMAT, "key": key, "published": published, "paths": list(paths), "fingerprint": made.digest}
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(data, handle)
    os.replace(temporary, record)  # whole or absent: a torn record would only cost a restore, but never half one
    # File times come from a clock that moves in ticks of a few milliseconds: a write within the tick of the
    # environment's last change would keep its change time. Past that tick (the record is newer), every later write
    # shows; else (never seen: the agent's first command starts much later) the next task restores, to be sure.
    if record.stat().st_ctime_ns <= made.newest_ns:
        forget(record)


def recalled(record: Path) -> WarmEnvironment | None:
    """The environment recorded for a working copy; None when there is none (or its record cannot be read)."""
    try:
        data = json.loads(record.read_text())
        if data.get("format") != FORMAT:
            return None
        paths = tuple(str(path) for path in data["paths"])
        return WarmEnvironment(str(data["key"]), float(data["published"]), paths, str(data["fingerprint"]))
    except _UNREADABLE:
        return None


def forget(record: Path) -> None:
    """The working copy holds no environment to reuse (its paths are gone, or were never a snapshot's)."""
    record.unlink(missing_ok=True)
