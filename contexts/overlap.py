"""I/O on two devices at once: the fleet's commit to its database while the host makes its own files durable."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

_pools: dict[int, ThreadPoolExecutor] = {}
_pools_guard = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """This process's pool (a forked child makes its own: threads do not survive a fork)."""
    pid = os.getpid()
    with _pools_guard:
        pool = _pools.get(pid)
        if pool is None:
            pool = _pools[pid] = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tasuki-overlap")
        return pool


@contextmanager
def meanwhile() -> Iterator[Callable[[Callable[[], None]], None]]:
    """``with meanwhile() as start:`` — ``start(work)`` runs ``work`` on a pool thread; the block's end waits for
    it, so nothing is left running. The started work's error wins over the block's (it is the commit point)."""
    started: list[Future[None]] = []
    try:
        yield lambda work: started.append(_pool().submit(work))
    finally:
        errors = [error for error in (future.exception() for future in started) if error is not None]
        if errors:
            raise errors[0]
