"""What a compression job reads: the span of messages it summarizes, from a context of 1,000 messages against
one of 1,000,000 (issue 13: it used to scan ``messages.jsonl`` from the start, 447 ms at 100,000 messages, at
every compression). The span is the 40 messages before the newest 5, as the policy picks it late in a task;
the baseline is the old full scan of the same file, for information.
"""

from __future__ import annotations

import json
import statistics
from itertools import takewhile
from pathlib import Path

from bench.common import Result, standalone, text_pool, timed
from contexts import jsonl

SMALL = 1_000
FULL_BIG = 1_000_000
QUICK_BIG = 20_000
SPAN = 40
KEEP_RECENT = 5
ROUNDS = 7


def write_messages(path: Path, count: int) -> None:
    """``count`` message records of about 1 KB, written in large batches."""
    texts = text_pool(1000, 64)
    with path.open("w", encoding="utf-8") as handle:
        batch = []
        for seq in range(1, count + 1):
            record = {"seq": seq, "role": "tool", "content": texts[seq % len(texts)], "token_count": 250,
                      "timestamp": "2026-11-25T00:00:00Z"}
            batch.append(json.dumps(record) + "\n")
            if len(batch) == 10_000:
                handle.writelines(batch)
                batch.clear()
        handle.writelines(batch)


def read_span(path: Path, count: int) -> int:
    """The compression job's read: the span only."""
    start, end = count - KEEP_RECENT - SPAN + 1, count - KEEP_RECENT
    span = list(takewhile(lambda r: int(r["seq"]) <= end, jsonl.iter_from_id(path, start)))
    assert len(span) == SPAN
    return len(span)


def full_scan(path: Path, count: int) -> int:
    """The old read: every record, filtered."""
    start, end = count - KEEP_RECENT - SPAN + 1, count - KEEP_RECENT
    return sum(1 for r in jsonl.iter_records(path) if start <= int(r["seq"]) <= end)


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Span reads at two sizes, alternately; the full scan of the big file for information."""
    big = QUICK_BIG if quick else FULL_BIG
    scratch.mkdir(parents=True, exist_ok=True)
    files = {SMALL: scratch / "small.jsonl", big: scratch / "big.jsonl"}
    for count, path in files.items():
        write_messages(path, count)
    small_times, big_times = [], []
    for _ in range(ROUNDS):
        small_times.append(timed(lambda: read_span(files[SMALL], SMALL)))
        big_times.append(timed(lambda: read_span(files[big], big)))
    scan = timed(lambda: full_scan(files[big], big))
    small_s, big_s = statistics.median(small_times), statistics.median(big_times)
    ratio = big_s / small_s
    print(f"span of {SPAN} messages: {big_s * 1000:.2f} ms at {big:,} messages vs {small_s * 1000:.2f} ms at "
          f"{SMALL:,}: {ratio:.2f}; the old full scan at {big:,}: {scan * 1000:.0f} ms", flush=True)
    return [Result(f"compression span read, {big:,} vs {SMALL:,} messages", f"{ratio:.2f}", "<= 2", ratio <= 2)]


if __name__ == "__main__":
    standalone(run, __doc__)
