"""Loaded (as ``sitecustomize``, through ``PYTHONPATH``) only into the test processes that run under libfaketime.

libfaketime 0.9.10 (Debian 12) with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` answers ``EINVAL`` to the absolute
``clock_nanosleep`` behind Python's ``time.sleep``; without that variable it fakes the monotonic clock too, and
every ``threading`` wait with a timeout hangs.  So the monotonic clock stays real and ``time.sleep`` waits with
``select``, which it handles.  Nothing of Tasuki's is changed: only the wall clock is off.
"""

import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    select.select([], [], [], seconds)


time.sleep = _sleep
