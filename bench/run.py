"""Run every benchmark and print a summary table: ``python -m bench.run [--quick] [--only NAME ...]``."""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench import (
    bench_app_tokens,
    bench_appends,
    bench_audit,
    bench_caching,
    bench_compose_failover,
    bench_compression,
    bench_compression_span,
    bench_console,
    bench_environments,
    bench_eval,
    bench_eval_mine,
    bench_failover,
    bench_fencing,
    bench_finish_gate,
    bench_first_task,
    bench_fleet,
    bench_fleet_failover,
    bench_fleet_recall,
    bench_followups,
    bench_hiccups,
    bench_index,
    bench_memory,
    bench_metrics,
    bench_monitor,
    bench_outcomes,
    bench_permissions,
    bench_prompt,
    bench_reading,
    bench_recall,
    bench_recall_quality,
    bench_resume,
    bench_sandbox,
    bench_spend,
    bench_throughput,
    bench_webhook,
    bench_workcopy,
    bench_worker_memory,
    local_model_calls,
)
from bench.common import Result, print_table

BENCHMARKS: dict[str, Callable[..., list[Result]]] = {
    "appends": bench_appends.run,
    "prompt": bench_prompt.run,
    "memory": bench_memory.run,
    "throughput": bench_throughput.run,  # issue 3: real worker, Redis, replay model, git
    "workcopy": bench_workcopy.run,  # issue 13 §3: warm working copies and checkpoints on a 5,000-file repository
    "worker-memory": bench_worker_memory.run,
    "monitor": bench_monitor.run,  # issue 4
    "failover": bench_failover.run,
    "webhook": bench_webhook.run,  # issue 5
    "sandbox": bench_sandbox.run,  # the bash tool in bubblewrap vs unsandboxed
    "followups": bench_followups.run,  # issue 12: review -> follow-up's first request, comment mid-run -> model
    "metrics": bench_metrics.run,  # issue 13 §4: a scrape does not read the running contexts
    "index": bench_index.run,  # issue 13 §4: context list, stats and alerts do not read the completed contexts
    "resume": bench_resume.run,  # issue 13 §4: a resume does not re-read unsummarized history
    "compression-span": bench_compression_span.run,  # issue 13 §4: a compression reads only its span
    "compression": bench_compression.run,  # issue 13: compression on a worker whose task process is busy
    "compose-failover": bench_compose_failover.run,  # issue 15: docker kill in the compose stack (needs Docker)
    "recall": bench_recall.run,  # issue 11: recall latency at 1k / 10k / 100k episodes
    "recall-quality": bench_recall_quality.run,  # issue 11: recall@5 hybrid vs BM25 vs vectors on a real history
    "spend": bench_spend.run,  # issue 17: a 40-step task with pricing and limits vs without
    "fencing": bench_fencing.run,  # issue 26 §1: a 40-step task with the owner check on every effect vs without
    "console": bench_console.run,  # issue 16: fleet and tasks pages at 11,000 vs 10 contexts; step -> open page
    "outcomes": bench_outcomes.run,  # issue 28: tasuki outcomes at 10,000 threads vs 100
    "app-tokens": bench_app_tokens.run,  # issue 28: GitHub App token renewals over simulated hours of task
    "fleet-recall": bench_fleet_recall.run,  # issue 27: recall p95 at 100,000 episodes, PostgreSQL vs SQLite
    "fleet": bench_fleet.run,  # issue 27: a step's durable write in PostgreSQL; list and stats at 100,000 vs 1,000
    "fleet-failover": bench_fleet_failover.run,  # issue 27: SIGKILL of a host -> the task's next step on another
    "environments": bench_environments.run,  # issue 25: restore vs setup on a real project, one build per key
    "local-model-calls": local_model_calls.run,  # issue 37: a small local model's replies whose call Tasuki runs
    "caching": bench_caching.run,  # issue 37: billed input of a 40-step session per provider vs ideal caching
    "hiccups": bench_hiccups.run,  # issue 37 §3: a 429 storm during running tasks; four workers on one rate limit
    "finish-gate": bench_finish_gate.run,  # issue 38 §5: the finish gate's time against a bug-fix task's
    "reading": bench_reading.run,  # issue 38 §2: tokens to find and read a function, search + windows vs whole file
    "eval": bench_eval.run,  # issue 39: 20 eval rows on 1, 2 and 4 workers; the harness's time per row vs the agent's
    "eval-mine": bench_eval_mine.run,  # issue 39: tasuki eval mine on itsdangerous: rows found, kept, time per row
    "audit": bench_audit.run,  # issue 40: tasuki audit at 1,000,000 lines vs 1,000 (newest, --since, filters, verify)
    "permissions": bench_permissions.run,  # issue 40: trigger admission with the permission cache warm/cold vs none
    "first-task": bench_first_task.run,  # issue 41: a new user's clock, fresh clone -> first pull request (tutorial)
}


def main(argv: list[str] | None = None) -> int:
    """Run the chosen benchmarks in a scratch directory that is removed afterwards."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes: checks the benchmarks run, measures nothing")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run only these benchmarks")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to put scratch contexts (default: the system temp dir)"
    )
    args = parser.parse_args(argv)
    mode = "quick (smoke run: sizes too small to mean anything)" if args.quick else "full"
    print(f"tasuki benchmarks, {mode}; Python {platform.python_version()} on {platform.machine()}", flush=True)
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="tasuki-bench-", dir=args.dir) as scratch:
        for name in args.only or BENCHMARKS:
            print(f"\n== {name}", flush=True)
            results += BENCHMARKS[name](Path(scratch) / name, quick=args.quick)
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
