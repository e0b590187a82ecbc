"""A real, small file system that really fills up: a tmpfs mounted for one test (root only, as in CI)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers.ci import cannot_run


@contextmanager
def mounted_tmpfs(mount_point: Path, size_bytes: int) -> Iterator[Path]:
    """Mount a tmpfs of ``size_bytes`` at ``mount_point`` (made if missing); unmounted on exit. Skips the test
    (fails it in CI) where mounting is not permitted."""
    mount_point.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        cannot_run("mounting a tmpfs needs root (CI runs as root)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(mount_point)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        cannot_run(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(directory: Path, leave_bytes: int = 0) -> Path:
    """Take all free space of the file system under ``directory`` but ``leave_bytes``; the filler file."""
    stat = os.statvfs(directory)
    free = stat.f_bavail * stat.f_frsize
    filler = directory / "filler"
    with open(filler, "wb") as out, contextlib.suppress(OSError):  # full already: what fitted stays
        out.write(b"\0" * max(free - leave_bytes, 0))
    return filler
