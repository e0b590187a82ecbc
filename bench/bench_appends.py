"""Appends per second through a context, per fsync policy, against a bare ``os.write`` loop of the same bytes."""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from bench.common import Result, new_store, standalone, start_context, text_pool
from contexts import Context
from contexts.clock import iso, utc_now
from contexts.jsonl import FSYNC_POLICIES, FsyncPolicy
from contexts.tokens import estimate_message_tokens

CONTENT_BYTES = 1024
# Appends per round; rounds of the context and the bare loop alternate, so that a burst of load from
# another process slows a round of each rather than all rounds of one.
FULL_ROUNDS: dict[FsyncPolicy, int] = {"never": 1_000, "step": 100, "always": 50}
QUICK_ROUNDS: dict[FsyncPolicy, int] = {"never": 100, "step": 10, "always": 4}
NEVER_TARGET = 0.5
STEP_SIZE = 2  # one agent step: the assistant's message and the tool's result


class BareLog:
    """The baseline: the same record encoded as the context encodes it, one ``os.write`` to an ``O_APPEND`` fd."""

    def __init__(self, path: Path, policy: FsyncPolicy, contents: list[str]) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.policy = policy
        self.contents = contents
        self.tokens = [estimate_message_tokens(c) for c in contents]
        self.timestamp = iso(utc_now())  # same length as the context's; reading the clock is context overhead
        self.seq = 2

    def round_seconds(self, count: int) -> float:
        """Time ``count`` appends, fsyncing after each (``always``) or after every step (``step``)."""
        fd, policy, contents, tokens = self.fd, self.policy, self.contents, self.tokens
        start = time.perf_counter()
        for i in range(count):
            self.seq += 1
            record = {
                "seq": self.seq,
                "role": "assistant",
                "content": contents[i % len(contents)],
                "timestamp": self.timestamp,
                "token_count": tokens[i % len(tokens)],
            }
            os.write(fd, json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")
            if policy == "always" or (policy == "step" and i % STEP_SIZE == STEP_SIZE - 1):
                os.fsync(fd)
        return time.perf_counter() - start

    def close(self) -> None:
        """Close the descriptor."""
        os.close(self.fd)


def context_round_seconds(ctx: Context, policy: FsyncPolicy, contents: list[str], count: int) -> float:
    """Time ``count`` ``append_message`` calls, with ``step_done`` after every step under ``step``."""
    step = policy == "step"
    start = time.perf_counter()
    for i in range(count):
        ctx.append_message("assistant", contents[i % len(contents)])
        if step and i % STEP_SIZE == STEP_SIZE - 1:
            ctx.step_done()
    return time.perf_counter() - start


def measure(scratch: Path, policy: FsyncPolicy, per_round: int, rounds: int) -> tuple[float, float]:
    """Median appends/s over alternating rounds of (context, bare loop), after one warm-up round of each."""
    contents = text_pool(CONTENT_BYTES, 64)
    ctx = start_context(new_store(scratch / f"store-{policy}", policy))
    bare = BareLog(scratch / f"bare-{policy}.jsonl", policy, contents)
    try:
        ctx_times: list[float] = []
        bare_times: list[float] = []
        for _ in range(rounds + 1):
            ctx_times.append(context_round_seconds(ctx, policy, contents, per_round))
            bare_times.append(bare.round_seconds(per_round))
    finally:
        ctx.release()
        bare.close()
    return per_round / statistics.median(ctx_times[1:]), per_round / statistics.median(bare_times[1:])


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Measure every fsync policy, print one line each, return the results."""
    per_round = QUICK_ROUNDS if quick else FULL_ROUNDS
    rounds = 3 if quick else 25
    results = []
    for policy in FSYNC_POLICIES[::-1]:  # never, step, always
        ctx_rate, bare_rate = measure(scratch, policy, per_round[policy], rounds)
        ratio = ctx_rate / bare_rate
        met = ratio >= NEVER_TARGET if policy == "never" else None
        target = f">= {NEVER_TARGET}" if policy == "never" else "-"
        result = Result(f"appends fsync={policy}", f"{ratio:.2f}", target, met)
        print(
            f"appends fsync={policy:<6}  context {ctx_rate:>9,.0f}/s  bare {bare_rate:>9,.0f}/s  "
            f"ratio {ratio:.2f}  target {target}  {result.verdict}  "
            f"(median of {rounds} rounds of {per_round[policy]:,} appends of {CONTENT_BYTES} B)",
            flush=True,
        )
        results.append(result)
    return results


if __name__ == "__main__":
    standalone(run, __doc__)
