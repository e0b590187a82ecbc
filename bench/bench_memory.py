"""Resident-set growth of appending messages through a context, against keeping them in a list (the seed's way).

Each side runs in a fresh interpreter, so that neither inherits the other's heap.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import Result, new_store, start_context, text_pool, vm_kb
from contexts.clock import iso, utc_now
from contexts.tokens import estimate_message_tokens

FULL_COUNT = 100_000
QUICK_COUNT = 2_000
CONTENT_BYTES = 1024
TARGET = 0.90  # the context's growth is at least 90 % below the list's
SIDES = ("context", "list")
_REPO = Path(__file__).resolve().parent.parent


def message_text(base: str, index: int) -> str:
    """A new 1 KB string per message, as an LLM reply is: the list cannot share one object between messages."""
    return f"{index:08d} {base}"[:CONTENT_BYTES]


def grow(side: str, count: int, scratch: Path) -> dict[str, int]:
    """Append ``count`` messages one way; return VmRSS before and after, and the peak, in KiB."""
    base = text_pool(CONTENT_BYTES, 1)[0]
    kept: list[dict[str, Any]] = []
    ctx = start_context(new_store(scratch, "never")) if side == "context" else None
    before = vm_kb("VmRSS")
    for index in range(count):
        content = message_text(base, index)
        if ctx is not None:
            ctx.append_message("assistant", content)
        else:  # the record append_message writes, kept in memory instead
            token_count = estimate_message_tokens(content)
            kept.append(
                {"role": "assistant", "content": content, "timestamp": iso(utc_now()), "token_count": token_count}
            )
    after = vm_kb("VmRSS")
    if ctx is not None:
        ctx.release()
    return {"before_kb": before, "after_kb": after, "peak_kb": vm_kb("VmHWM"), "kept": len(kept)}


def measure_side(side: str, count: int, scratch: Path) -> dict[str, int]:
    """Run :func:`grow` in a fresh interpreter and read its JSON report."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.bench_memory", "--side", side, "--count", str(count), "--dir", str(scratch)],
        cwd=_REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    report: dict[str, int] = json.loads(out.stdout.strip().splitlines()[-1])
    return report


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Measure both sides, print their growth and the reduction."""
    count = QUICK_COUNT if quick else FULL_COUNT
    growth = {}
    for side in SIDES:
        report = measure_side(side, count, scratch / f"memory-{side}")
        growth[side] = report["after_kb"] - report["before_kb"]
        print(
            f"memory: {side:<7} VmRSS growth {growth[side] / 1024:8.1f} MiB ({growth[side]:,} KiB)  "
            f"(VmRSS {report['before_kb'] / 1024:.1f} -> {report['after_kb'] / 1024:.1f} MiB, "
            f"peak {report['peak_kb'] / 1024:.1f} MiB)",
            flush=True,
        )
    reduction = 1 - max(growth["context"], 0) / growth["list"]
    result = Result("memory growth reduction", f"{reduction:.1%}", f">= {TARGET:.0%}", reduction >= TARGET)
    print(
        f"memory: {count:,} messages of {CONTENT_BYTES} B  context/list growth ratio {1 - reduction:.3f}  "
        f"reduction {reduction:.1%}  target >= {TARGET:.0%}  {result.verdict}",
        flush=True,
    )
    return [result]


def main() -> None:
    """``python -m bench.bench_memory [--quick]``; ``--side`` is the child process's entry."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_COUNT:,} messages instead of {FULL_COUNT:,}")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=FULL_COUNT, help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(json.dumps(grow(args.side, args.count, args.dir)))
        return
    with tempfile.TemporaryDirectory(prefix="tasuki-bench-") as scratch:
        run(Path(scratch), quick=args.quick)


if __name__ == "__main__":
    main()
