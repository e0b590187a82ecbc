"""What every benchmark shares: test data, timing, scratch contexts, RSS readings and the result table."""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from contexts import Context, ContextStore
from contexts.jsonl import FsyncPolicy

TASK_KEY = {"task_source": "local", "owner": "bench", "repo": "bench", "task_type": "issue", "task_id": "1"}
CONFIG = {"provider": "bench", "model": "bench", "context_length": 32768}
SYSTEM_PROMPT = "You are a coding agent working on a repository checkout."
TASK_PROMPT = "Fix the failing test in tests/test_example.py and explain the change."
_VOCABULARY = (
    "the function returns a list of paths read from the configuration file and the test expects "
    "sorted output so we change the loop to build a new list then sort it before returning while "
    "keeping the old behaviour for callers that pass an explicit order argument "
    "def read_paths(config_file: str) -> list[str]: return sorted(self._paths) "
    "tests/test_config.py::test_read_paths_sorted FAILED AssertionError: assert ['b', 'a'] == ['a', 'b'] "
    "$ python -m pytest -x -q --no-header tests/test_config.py && git diff --stat"
)


def text_pool(size: int, count: int, seed: int = 1) -> list[str]:
    """``count`` distinct ASCII texts of ``size`` characters, prose and code, with nothing masking would rewrite."""
    rng = random.Random(seed)
    vocabulary = _VOCABULARY.split()
    pool = []
    for _ in range(count):
        words: list[str] = []
        length = 0
        while length < size:
            word = rng.choice(vocabulary)
            words.append(word)
            length += len(word) + 1
        pool.append(" ".join(words)[:size])
    return pool


def timed(action: Callable[[], object]) -> float:
    """Seconds ``action`` takes, by ``time.perf_counter``."""
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def new_store(base: Path, fsync: FsyncPolicy = "step") -> ContextStore:
    """A store whose heartbeat (once an hour) never fires during a benchmark."""
    return ContextStore(base, fsync=fsync, heartbeat_interval_s=3600, stale_after_s=7200)


def start_context(store: ContextStore) -> Context:
    """A new context holding the pinned system prompt and task, as the agent loop starts one."""
    ctx = store.create(TASK_KEY, CONFIG, heartbeat=False)
    ctx.append_message("system", SYSTEM_PROMPT)
    ctx.append_message("user", TASK_PROMPT)
    ctx.step_done()
    return ctx


def vm_kb(field: str = "VmRSS") -> int:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``) in KiB."""
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


@dataclass(frozen=True)
class Result:
    """One benchmark's verdict: the ratio, the target it is held to (if any) and whether it met it."""

    name: str
    ratio: str
    target: str
    met: bool | None  # None: printed for information, no target

    @property
    def verdict(self) -> str:
        """PASS, MISS or info."""
        if self.met is None:
            return "info"
        return "PASS" if self.met else "MISS"


def print_table(results: list[Result]) -> None:
    """The summary table run.py ends with."""
    print()
    print(f"{'benchmark':<34} {'ratio':>10}  {'target':<10} result")
    print("-" * 64)
    for result in results:
        print(f"{result.name:<34} {result.ratio:>10}  {result.target:<10} {result.verdict}")


def standalone(run: Callable[..., list[Result]], doc: str | None) -> None:
    """``python -m bench.bench_X [--quick]``: one benchmark on its own, in a scratch directory."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run, not a measurement")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tasuki-bench-") as scratch:
        print_table(run(Path(scratch), quick=args.quick))
