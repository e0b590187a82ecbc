"""Resuming a context whose summaries kept failing: ``ContextStore.open`` of a context with 1,000,000
unsummarized messages against one with 1,000 (issue 13: every resume re-read all unsummarized history,
570 ms at 100,000). ``state.json`` now keeps the unsummarized counters as of its last write, so an open
reads only the pinned head and what came after that write. Also a compression attempt on the same contexts
(its summary fails, as it kept doing): it reads the oldest messages a span may take, not all of them.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from functools import partial
from pathlib import Path
from typing import Any

from bench.bench_prompt import History
from bench.common import Result, new_store, standalone, start_context, timed
from contexts import CompressionPolicy, Context, ContextStore

SMALL = 1_000
FULL_BIG = 1_000_000
QUICK_BIG = 20_000
TARGET = 2.0
POLICY = CompressionPolicy()
SPAN_TOKENS = 20_000  # what the worker lets one summary request carry at a 32k window


def build(store: ContextStore, count: int) -> str:
    """A context of ``count`` unsummarized messages whose last state write came after all of them."""
    ctx = start_context(store)
    uuid, path = ctx.uuid, ctx.path
    ctx.release()
    History().write(path / "messages.jsonl", count)
    ctx = store.open(uuid, resume=False, heartbeat=False)  # counts them once, as the first resume did
    ctx.update_state(last_activity="llm_reply")  # the worker's next state write records the counters
    ctx.release()
    return uuid


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Open (and release) both contexts alternately; the ratio of the medians."""
    big = QUICK_BIG if quick else FULL_BIG
    store = new_store(scratch / "resume-store")
    uuids = {}
    for count in (SMALL, big):
        started = time.perf_counter()
        uuids[count] = build(store, count)
        print(f"resume: wrote a context of {count:,} messages in {time.perf_counter() - started:.1f} s", flush=True)

    def reopen(uuid: str) -> None:
        store.open(uuid, resume=False, heartbeat=False).release()

    times: dict[int, list[float]] = {SMALL: [], big: []}
    for _ in range(5 if quick else 21):
        for count, uuid in uuids.items():
            times[count].append(timed(partial(reopen, uuid)))
    small_s, big_s = statistics.median(times[SMALL]), statistics.median(times[big])
    ratio = big_s / small_s
    print(f"resume: open at {big:,} unsummarized messages {big_s * 1e3:.2f} ms vs {small_s * 1e3:.2f} ms at "
          f"{SMALL:,}: {ratio:.2f}", flush=True)
    results = [Result(f"resume (open) {big:,} vs {SMALL:,} unsummarized", f"{ratio:.2f}", f"<= {TARGET:g}",
                      ratio <= TARGET)]
    retry = retry_ratio(store, uuids, big, 5 if quick else 21)
    results.append(Result(f"compression retry {big:,} vs {SMALL:,} unsummarized", f"{retry:.2f}",
                          f"<= {TARGET:g}", retry <= TARGET))
    return results


class SummaryFailed(Exception):
    """The model did not answer: the compression is retried later."""


def fail(previous: str | None, span: list[dict[str, Any]]) -> str:
    raise SummaryFailed


def retry_ratio(store: ContextStore, uuids: dict[int, str], big: int, repeat: int) -> float:
    """A compression attempt whose summary fails (what is read to pick its span), big vs small."""
    contexts = {count: store.open(uuid, resume=False, heartbeat=False) for count, uuid in uuids.items()}

    def attempt(ctx: Context) -> None:
        with contextlib.suppress(SummaryFailed):
            ctx.compress(fail, POLICY, SPAN_TOKENS)

    try:
        times: dict[int, list[float]] = {count: [] for count in contexts}
        for _ in range(repeat):
            for count, ctx in contexts.items():
                times[count].append(timed(partial(attempt, ctx)))
    finally:
        for ctx in contexts.values():
            ctx.release()
    small_s, big_s = statistics.median(times[SMALL]), statistics.median(times[big])
    print(f"resume: a failing compression attempt at {big:,} unsummarized messages {big_s * 1e3:.2f} ms vs "
          f"{small_s * 1e3:.2f} ms at {SMALL:,}: {big_s / small_s:.2f}", flush=True)
    return big_s / small_s


if __name__ == "__main__":
    standalone(run, __doc__)
