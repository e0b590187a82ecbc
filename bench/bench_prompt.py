"""``build_prompt`` on a context of 1,000 messages against one of 1,000,000: the cost must not follow history."""

from __future__ import annotations

import json
import statistics
import time
from collections import deque
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import Result, new_store, standalone, start_context, text_pool, timed
from contexts import ContextStore
from contexts.clock import iso, utc_now
from contexts.compression import CompressionPolicy, make_summary_record
from contexts.jsonl import JsonlWriter
from contexts.names import MESSAGES_FILE, SUMMARIES_FILE
from contexts.tokens import estimate_message_tokens

SMALL = 1_000
FULL_BIG = 1_000_000
QUICK_BIG = 20_000
CONTEXT_LENGTH = 32_768
TARGET = 2.0
# The history after the latest summary fills 60 % of the window: just under the compression threshold,
# the most a healthy context carries unsummarized, so build_prompt reads the most it ever reads.
UNSUMMARIZED_SHARE = CompressionPolicy().threshold - 0.1
FIRST_SEQ = 3  # after the pinned system prompt and task
_WRITE_BATCH = 10_000
_TOOL_CALL = {"name": "bash", "arguments": json.dumps({"command": "python -m pytest -x -q tests/test_config.py"})}


class History:
    """Writes agent steps (an assistant message calling a tool, then the tool's result) as the context would."""

    def __init__(self) -> None:
        self.assistant_texts = text_pool(256, 32, seed=2)
        self.tool_texts = text_pool(1792, 32, seed=3)
        self.timestamp = iso(utc_now())
        self.total_tokens = 0
        self.tail: deque[tuple[int, int]] = deque(maxlen=2_000)  # (seq, token_count) of the newest records

    def record(self, seq: int) -> dict[str, Any]:
        """The ``messages.jsonl`` record with this ``seq``: odd offsets call the tool, even ones answer."""
        index = seq - FIRST_SEQ
        call_id = f"call_{seq - index % 2}"
        if index % 2 == 0:
            content = self.assistant_texts[index // 2 % len(self.assistant_texts)]
            calls = [{"id": call_id, "type": "function", "function": _TOOL_CALL}]
            extra: dict[str, Any] = {"tool_calls": calls}
        else:
            content = self.tool_texts[index // 2 % len(self.tool_texts)]
            calls = None
            extra = {"tool_call_id": call_id, "tool_name": "bash"}
        tokens = estimate_message_tokens(content, calls)
        self.total_tokens += tokens
        self.tail.append((seq, tokens))
        return {
            "seq": seq,
            "role": "tool" if calls is None else "assistant",
            "content": content,
            **extra,
            "timestamp": self.timestamp,
            "token_count": tokens,
        }

    def write(self, path: Path, count: int) -> None:
        """Append ``count`` messages (an even number: whole steps) in the JsonlWriter's line format."""
        with open(path, "ab") as handle:
            lines: list[str] = []
            for seq in range(FIRST_SEQ, FIRST_SEQ + count):
                lines.append(json.dumps(self.record(seq), ensure_ascii=False, separators=(",", ":")))
                if len(lines) == _WRITE_BATCH:
                    handle.write(("\n".join(lines) + "\n").encode())
                    lines = []
            if lines:
                handle.write(("\n".join(lines) + "\n").encode())

    def boundary(self, budget: int) -> int:
        """The newest tool result such that every later step fits ``budget`` tokens: where the summary ends."""
        kept = 0
        records = list(self.tail)
        for i in range(len(records) - 2, -1, -2):  # whole steps, newest first: (assistant, tool) pairs
            step_tokens = records[i][1] + records[i + 1][1]
            if kept + step_tokens > budget:
                return records[i + 1][0]
            kept += step_tokens
        raise ValueError("history too short for the budget")


def build_context(store: ContextStore, count: int) -> str:
    """A context of ``count`` messages after the pinned two, with a summary of all but the newest steps."""
    ctx = start_context(store)
    uuid, path = ctx.uuid, ctx.path
    ctx.release()
    history = History()
    history.write(path / MESSAGES_FILE, count)
    end_seq = history.boundary(int(UNSUMMARIZED_SHARE * CONTEXT_LENGTH))
    kept_tokens = sum(tokens for seq, tokens in history.tail if seq > end_seq)
    span = [{"seq": FIRST_SEQ, "token_count": history.total_tokens - kept_tokens}, {"seq": end_seq}]
    summary = make_summary_record(span=span, previous=None, text=text_pool(1536, 1, seed=4)[0], now=utc_now())
    summaries = JsonlWriter(path / SUMMARIES_FILE, id_field="summary_id", fsync="never")
    summaries.append(summary)
    summaries.close()
    return uuid


def open_seconds(store: ContextStore, uuid: str, repeat: int) -> float:
    """Median time of ``ContextStore.open`` (then released), for information."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        ctx = store.open(uuid, resume=False, heartbeat=False)
        times.append(time.perf_counter() - start)
        ctx.release()
    return statistics.median(times)


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Build both contexts, time ``open`` and ``build_prompt`` on each, print the ratio."""
    big = QUICK_BIG if quick else FULL_BIG
    repeat = 5 if quick else 31
    store = new_store(scratch / "prompt-store")
    uuids = {}
    for count in (SMALL, big):
        start = time.perf_counter()
        uuids[count] = build_context(store, count)
        print(f"prompt: wrote a context of {count:,} messages in {time.perf_counter() - start:.1f} s", flush=True)
    opened = {count: open_seconds(store, uuid, 5) for count, uuid in uuids.items()}
    contexts = {count: store.open(uuid, resume=False, heartbeat=False) for count, uuid in uuids.items()}
    try:
        prompts = {count: ctx.build_prompt(CONTEXT_LENGTH) for count, ctx in contexts.items()}  # warm-up
        times: dict[int, list[float]] = {count: [] for count in contexts}
        for _ in range(repeat):  # alternate, so that load from other processes hits both sizes
            for count, ctx in contexts.items():
                times[count].append(timed(partial(ctx.build_prompt, CONTEXT_LENGTH)))
    finally:
        for ctx in contexts.values():
            ctx.release()
    small_s, big_s = statistics.median(times[SMALL]), statistics.median(times[big])
    ratio = big_s / small_s
    result = Result(f"build_prompt {big:,}/{SMALL:,}", f"{ratio:.2f}", f"<= {TARGET:g}", ratio <= TARGET)
    for count in (SMALL, big):
        print(
            f"prompt: {count:>9,} messages  build_prompt {statistics.median(times[count]) * 1e3:7.2f} ms  "
            f"({len(prompts[count])} prompt messages)  open {opened[count] * 1e3:7.2f} ms (information)"
        )
    print(
        f"prompt: build_prompt {big:,} vs {SMALL:,} messages  ratio {ratio:.2f}  target <= {TARGET:g}  "
        f"{result.verdict}  (median of {repeat}, context_length {CONTEXT_LENGTH:,})",
        flush=True,
    )
    return [result]


if __name__ == "__main__":
    standalone(run, __doc__)
