"""The console (issue 16): the fleet and tasks pages with 10,000 completed and 1,000 running contexts against 10
contexts, and how long a step written to a running task's context takes to reach its open page.

Both fleets are real stores (contexts made through ``ContextStore``, indexed as the writers index them) with
their own private Redis (the holders' heartbeat index); each page is fetched over real HTTP from uvicorn, with
a signed-in session, alternately from the two consoles; the ratio is of the medians. The latency is from the
append of a step's last record to the arrival of its ``step`` event on the page's event stream (what htmx's
SSE extension swaps into the page).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx
import redis
import uvicorn

from bench.common import Result, standalone
from bench.worker_stack import private_redis
from console.app import create_console
from contexts import Context, ContextStore
from worker.runtime import index_heartbeat
from worker.settings import install_settings, load_settings

SMALL = 10
FULL = (10_000, 1_000)  # completed, running
QUICK = (300, 50)
TARGET = 2.0
LATENCY_TARGET_S = 2.0
TOKEN = "bench-console-token"  # noqa: S105 - a scratch console of the benchmark
CONFIG = {"llm_provider": "openai", "model": "bench", "context_length": 32768, "compression_threshold": 0.7}


def key(n: int) -> dict[str, str]:
    return {"task_source": "github", "owner": "bench", "repo": f"repo{n % 20}", "task_type": "issue",
            "task_id": str(n)}


def one_step(ctx: Context, n: int) -> None:
    """An agent step: the model's reply asking for a command, its record and its tool message."""
    call = f"call-{n}"
    ctx.append_message("assistant", f"step {n}", prompt_tokens=1000 + n, tool_calls=[
        {"id": call, "type": "function", "function": {"name": "bash", "arguments": '{"command": "make test"}'}}])
    ctx.append_tool("bash", {"command": "make test"}, "success", 12, result="ok\nexit code: 0", tool_call_id=call)
    ctx.append_message("tool", "ok\nexit code: 0", tool_call_id=call, tool_name="bash")
    ctx.step_done()


def make_fleet(root: Path, url: str, completed: int, running: int) -> ContextStore:
    """``completed`` finished contexts and ``running`` running ones (each in the Redis heartbeat index)."""
    install_settings(load_settings(env={"TASUKI__BROKER__URL": url, "TASUKI__CONTEXTS__BASE_DIR": str(root)}))
    store = ContextStore(root, fsync="never", heartbeat_interval_s=3600, stale_after_s=7200,
                         on_heartbeat=index_heartbeat)
    for n in range(completed + running):
        ctx = store.create(key(n), CONFIG, user=f"user{n % 7}", heartbeat=False)
        ctx.update_state(status="processing")
        one_step(ctx, 1)
        if n < completed:
            ctx.finish("completed" if n % 10 else "failed")
        else:
            index_heartbeat(ctx.uuid, datetime.now(UTC), "processing")
            ctx.detach()  # files closed, lock left as a live holder's: a thousand open contexts need no fds
    return store


@contextmanager
def console_server(root: Path, url: str) -> Iterator[httpx.Client]:
    """The console over ``root`` on uvicorn in a thread; yields a signed-in HTTP client."""
    settings = load_settings(env={"TASUKI__BROKER__URL": url, "TASUKI__CONTEXTS__BASE_DIR": str(root),
                                  "TASUKI__CONSOLE__TOKEN": TOKEN})
    store = ContextStore(root, heartbeat_interval_s=3600, stale_after_s=7200)
    app = create_console(settings, store, client=redis.Redis.from_url(url))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)  # a starting server: nothing to wait on but its flag
    port = server.servers[0].sockets[0].getsockname()[1]
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    client.post("/signin", data={"token": TOKEN})
    try:
        yield client
    finally:
        client.close()
        server.should_exit = True
        thread.join(timeout=15)


def get(client: httpx.Client, path: str) -> float:
    start = time.perf_counter()
    answer = client.get(path)
    elapsed = time.perf_counter() - start
    assert answer.status_code == 200, (path, answer.status_code)
    return elapsed


def step_latencies(client: httpx.Client, store: ContextStore, count: int) -> list[float]:
    """Seconds from a step's last write to its ``step`` event on the open page's stream, ``count`` times."""
    ctx = store.create(key(999_999), CONFIG, heartbeat=False)
    ctx.update_state(status="processing")
    latencies: list[float] = []
    with client.stream("GET", f"/tasks/{ctx.uuid}/events") as stream:
        lines = stream.iter_lines()
        for n in range(count):
            one_step(ctx, n)
            written = time.perf_counter()
            for line in lines:
                if line == "event: step":
                    latencies.append(time.perf_counter() - written)
                    break
            time.sleep(0.05 + (n % 5) * 0.037)  # spread the writes over the stream's poll interval
    ctx.finish("completed")
    return latencies


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(fraction * len(ordered)), len(ordered) - 1)]


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Both pages on both fleets, alternately; then the step latency on the big fleet."""
    completed, running = QUICK if quick else FULL
    with private_redis(scratch / "redis-small") as small_url, private_redis(scratch / "redis-big") as big_url:
        started = time.perf_counter()
        make_fleet(scratch / "small", small_url, SMALL // 2, SMALL - SMALL // 2)
        big_store = make_fleet(scratch / "big", big_url, completed, running)
        print(f"console: made {completed:,} completed and {running:,} running contexts in "
              f"{time.perf_counter() - started:.1f} s", flush=True)
        times: dict[tuple[str, str], list[float]] = {}
        with console_server(scratch / "small", small_url) as small, console_server(scratch / "big", big_url) as big:
            for _ in range(5 if quick else 31):
                for page in ("/", "/tasks"):
                    for fleet, client in (("small", small), ("big", big)):
                        times.setdefault((page, fleet), []).append(get(client, page))
            latencies = step_latencies(big, big_store, 10 if quick else 40)
    results = []
    for page, name in (("/", "fleet page"), ("/tasks", "tasks page")):
        small_s, big_s = statistics.median(times[(page, "small")]), statistics.median(times[(page, "big")])
        ratio = big_s / small_s
        print(f"console: {name} with {completed:,} completed + {running:,} running {big_s * 1e3:.1f} ms vs "
              f"{small_s * 1e3:.1f} ms with {SMALL}: {ratio:.2f}", flush=True)
        results.append(Result(f"console {name}, {completed + running:,} vs {SMALL}", f"{ratio:.2f}",
                              f"<= {TARGET:g}", ratio <= TARGET))
    p50, p95 = percentile(latencies, 0.5), percentile(latencies, 0.95)
    print(f"console: step on disk -> open task page p50 {p50 * 1e3:.0f} ms, p95 {p95 * 1e3:.0f} ms "
          f"({len(latencies)} steps)", flush=True)
    results.append(Result("console step -> page p95 (s)", f"{p95:.2f}", f"<= {LATENCY_TARGET_S:g}",
                          p95 <= LATENCY_TARGET_S))
    return results


if __name__ == "__main__":
    standalone(run, __doc__)
