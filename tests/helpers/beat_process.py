"""Real ``celery -A worker beat`` processes for scheduler tests, and the pool children of a worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.celery_worker import REPO_ROOT

SENT_MARKER = "Sending due task"


@dataclass
class BeatProcess:
    """One beat in its own process group, with its own schedule file; its log is where sends are counted."""

    name: str
    env: dict[str, str]
    root: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def log_path(self) -> Path:
        return self.root / f"{self.name}.log"

    def start(self) -> BeatProcess:
        cmd = [sys.executable, "-m", "celery", "-A", "worker", "beat", "-l", "INFO",
               "-s", str(self.root / f"{self.name}-schedule")]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                cmd, cwd=REPO_ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    def sends(self, task: str = "") -> int:
        """How many due tasks (named ``task``, when given) this beat has sent so far."""
        if not self.log_path.exists():
            return 0
        lines = self.log_path.read_text(errors="replace").splitlines()
        return sum(SENT_MARKER in line and task in line for line in lines)

    def kill(self) -> None:
        """SIGKILL (the machine died): no chance to release the lock."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill()


def children_of(pid: int) -> set[int]:
    """Process ids whose parent is ``pid`` (Linux ``/proc``): a prefork worker's pool children."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(entry))
    return found
