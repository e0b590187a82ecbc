"""Child processes that never outlive the command that started them (``up``, ``demo``, ``tasuki worker``).

Each service runs in a session of its own, so that a terminal's Ctrl-C reaches only the parent, which stops them
in order. A parent killed outright (SIGKILL, the OOM killer) could not: on Linux each child asks the kernel for
SIGTERM when its parent dies (``PR_SET_PDEATHSIG``); a Celery worker then shuts down warm and hands its task back.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None  # loaded here, not in the child


def dies_with_this_process() -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen`` (None where the kernel has no such request)."""
    if _LIBC is None:
        return None
    parent = os.getpid()
    prctl = _LIBC.prctl

    def die_with_parent() -> None:  # in the child, between fork and exec: one system call, no lock, no import
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the request was made
            os.kill(os.getpid(), signal.SIGTERM)

    return die_with_parent
