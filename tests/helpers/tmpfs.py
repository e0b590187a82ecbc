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
    with _mounted(["-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs"], mount_point, "a tmpfs"):
        yield mount_point


@contextmanager
def bind_mounted(source: Path, mount_point: Path) -> Iterator[Path]:
    """``source`` seen again at ``mount_point`` (made if missing) through a bind mount: the same file system, yet a
    rename between the two mounts fails with EXDEV; unmounted on exit. Skips as :func:`mounted_tmpfs` does."""
    with _mounted(["--bind", str(source)], mount_point, "a bind mount"):
        yield mount_point


@contextmanager
def _mounted(arguments: list[str], mount_point: Path, what: str) -> Iterator[None]:
    mount_point.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        cannot_run(f"mounting {what} needs root (CI runs as root)")
    mounted = subprocess.run(["mount", *arguments, str(mount_point)], capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        cannot_run(f"cannot mount {what} here: {mounted.stderr.strip()}")
    try:
        yield
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
