"""A process's wall clock moved by libfaketime, for tests of hosts whose clocks are off (tests/test_clock_skew.py,
tests/test_fleet_hosts.py).

Preloaded through the environment rather than the ``faketime`` command, because the monotonic clock must stay real
(``FAKETIME_DONT_FAKE_MONOTONIC``) and ``time.sleep`` needs the shim in tests/helpers/faketime_sleep (it says why).
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.helpers.ci import cannot_run

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
SLEEP_SHIM = Path(__file__).resolve().parent / "faketime_sleep"


def require_libfaketime() -> None:
    """Skip (fail in CI) where libfaketime is not installed."""
    if not LIBFAKETIME.exists():
        cannot_run("libfaketime is not installed (apt-get install faketime)")


def faketime_env(env: dict[str, str], offset: str) -> dict[str, str]:
    """``env`` with the wall clock moved by ``offset`` seconds (``+120``, ``-300``), the monotonic clock real, and
    no sandbox (bubblewrap refuses to start with libfaketime preloaded into it)."""
    path = os.pathsep.join(p for p in (str(SLEEP_SHIM), env.get("PYTHONPATH", "")) if p)
    return {
        **env,
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": path,
        "TASUKI__SANDBOX__BACKEND": "none",
    }
