"""Webhook intake latency (p50, p99) and deliveries/s with 1 and with 50 concurrent senders, against a bare route.

Both servers are uvicorn processes with the same settings; the baseline is a FastAPI route that only
answers 200. Every Tasuki delivery is a signed ``issues.labeled`` example for a new issue, so it takes the
whole path: read the body, verify HMAC-SHA256, parse, classify, and in one Redis script dedupe the delivery,
claim the task key, remember it and push ``tasuki.run_task``; answer 202. The senders speak raw HTTP/1.1 on
keep-alive connections from processes of their own, so that the client costs as little as possible of what is
measured and never shares a CPU-bound loop with it ("sender CPU" says how busy the busiest sender process was).

``python -m bench.bench_webhook [--quick]``; the servers run as ``python -m bench.bench_webhook --serve``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid as uuid_module
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.common import Result
from bench.worker_stack import private_redis

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = REPO_ROOT / "tests" / "fixtures" / "webhooks" / "github" / "issues.labeled.json"
SECRET = "bench-webhook-secret"  # noqa: S105 - a throwaway secret of the benchmark's own servers
SENDERS = 50
SENDER_PROCESSES = 2  # the senders' own processes: one asyncio loop in the server's process was the bottleneck
SENDER_START_S = 0.5  # time for every sender process to connect before the round starts
TARGET_RATE_RATIO = 0.3  # issue 13 §2
READY_TIMEOUT_S = 30.0


def bare_app() -> object:
    """The baseline: the same framework, one route, nothing but a 200."""
    from fastapi import FastAPI, Response

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.post("/webhooks/github")
    async def github() -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    return app


def tasuki_app(redis_url: str, scratch: Path) -> object:
    """Tasuki's intake on ``redis_url``."""
    from celery import Celery

    from webhooks import create_app
    from worker.celery import celery_config
    from worker.settings import load_settings

    config = scratch / "config.yaml"
    config.write_text("")
    settings = load_settings(
        config_path=config,
        env={
            "TASUKI__BROKER__URL": redis_url,
            "TASUKI__CONTEXTS__BASE_DIR": str(scratch / "contexts"),
            "TASUKI__GITHUB__LABELS__TRIGGER": "bug",
            # The intake's own work, as measured since issue 7; the forge-permission lookup each trigger now gets
            # is bench_permissions' subject (warm cache: 0.87 of this admission), not this one's.
            "TASUKI__PERMISSIONS__CHECK": "false",
            "GITHUB_WEBHOOK_SECRET": SECRET,
        },
    )
    celery = Celery("tasuki-bench")
    celery.conf.update(celery_config(settings))
    return create_app(settings, redis.Redis.from_url(redis_url), celery)


def serve(kind: str, port: int, redis_url: str, scratch: Path) -> None:
    """Child process: run one of the two apps until terminated."""
    import uvicorn

    from webhooks.server import freeze_startup_objects
    from worker.logging import configure_logging

    configure_logging("INFO", json=True)  # as `tasuki webhook` logs: a JSON line per enqueued task
    app = bare_app() if kind == "bare" else tasuki_app(redis_url, scratch)
    freeze_startup_objects()  # as `tasuki webhook` does, for both
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)  # type: ignore[arg-type]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


Server = tuple[subprocess.Popen[bytes], int]  # the process and its port


def start_server(kind: str, redis_url: str, scratch: Path) -> Server:
    """Start a server process and wait until its port accepts connections."""
    port = free_port()
    with open(scratch / f"{kind}.log", "wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.bench_webhook",
                "--serve",
                kind,
                "--port",
                str(port),
                "--redis",
                redis_url,
                "--scratch",
                str(scratch),
            ],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{kind} server exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process, port
        except OSError:
            time.sleep(0.05)  # polling a starting server
    process.kill()
    raise RuntimeError(f"{kind} server did not start")


def deliveries(count: int) -> list[bytes]:
    """``count`` signed ``issues.labeled`` deliveries, each for a new issue, as raw HTTP requests."""
    from webhooks.signatures import github_signature

    example = json.loads(EXAMPLE.read_text())
    raw = []
    for number in range(count):
        example["issue"]["number"] = 100_000 + number
        body = json.dumps(example).encode()
        head = (
            "POST /webhooks/github HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nX-GitHub-Event: issues\r\nX-GitHub-Hook-ID: 1\r\n"
            f"X-GitHub-Delivery: {uuid_module.uuid4()}\r\nX-Hub-Signature-256: {github_signature(SECRET, body)}\r\n\r\n"
        )
        raw.append(head.encode() + body)
    return raw


async def _send_all(port: int, requests: list[bytes], latencies: list[float], start_at: float) -> list[int]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    statuses = []
    try:
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))  # every sender starts at the same moment
        for request in requests:
            start = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - start)
            statuses.append(int(head.split(b" ", 2)[1]))
    finally:
        writer.close()
    return statuses


def send_share(port: int, shares: list[list[bytes]], start_at: float) -> Share:
    """Sender process: one keep-alive connection per share, all sent from ``start_at`` (``time.monotonic``)."""

    async def send() -> list[list[int]]:
        return await asyncio.gather(*(_send_all(port, share, latencies, start_at) for share in shares))

    latencies: list[float] = []
    cpu = time.process_time()
    statuses = [status for part in asyncio.run(send()) for status in part]
    return Share(latencies, statuses, time.monotonic(), time.process_time() - cpu)


@dataclass(frozen=True)
class Share:
    """What one sender process measured."""

    latencies: list[float]
    statuses: list[int]
    finished_at: float  # time.monotonic
    cpu_s: float


@dataclass(frozen=True)
class Round:
    """One round against one server: p50 and p99 latency (s), deliveries/s, the server's CPU time per delivery
    (s: what throughput comes down to on a loaded machine) and how busy the busiest sender process was."""

    p50: float
    p99: float
    rate: float
    server_cpu: float
    sender_busy: float


def cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def measure(
    kind: str, server: Server, requests: list[bytes], client: redis.Redis, pool: ProcessPoolExecutor, senders: int
) -> Round:
    """One round of ``requests`` over ``senders`` connections spread over the sender processes; Redis is emptied
    before it."""
    client.flushdb()  # the benchmark's own private Redis
    processes = min(senders, SENDER_PROCESSES)
    connections = [requests[i::senders] for i in range(senders)]
    process, port = server
    start_at = time.monotonic() + SENDER_START_S
    futures = [pool.submit(send_share, port, connections[i::processes], start_at) for i in range(processes)]
    cpu = cpu_s(process.pid)
    shares = [future.result() for future in futures]
    cpu = cpu_s(process.pid) - cpu
    elapsed = max(share.finished_at for share in shares) - start_at
    statuses = [status for share in shares for status in share.statuses]
    expected = 202 if kind == "tasuki" else 200
    wrong = [s for s in statuses if s != expected]
    if wrong or len(statuses) != len(requests):
        raise RuntimeError(f"{kind}: {len(wrong)} answers were not {expected}, e.g. {wrong[:1]}")
    latencies = [latency for share in shares for latency in share.latencies]
    busy = max(share.cpu_s for share in shares) / elapsed
    return Round(percentile(latencies, 0.5), percentile(latencies, 0.99), len(requests) / elapsed,
                 cpu / len(requests), busy)


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Measure both servers in alternating rounds at 1 and at 50 senders; print and return the ratios."""
    per_round = 1_000 if quick else 10_000
    alone_count = 200 if quick else 2_000
    rounds = 1 if quick else 5
    scratch.mkdir(parents=True, exist_ok=True)
    requests = deliveries(per_round)
    with private_redis(scratch / "redis") as redis_url, \
            ProcessPoolExecutor(SENDER_PROCESSES, mp_context=multiprocessing.get_context("spawn")) as pool:
        client = redis.Redis.from_url(redis_url)
        servers = {kind: start_server(kind, redis_url, scratch) for kind in ("bare", "tasuki")}
        try:
            for kind, server in servers.items():  # warm both: imports, the Lua script, connections
                measure(kind, server, requests[: SENDERS * 4], client, pool, SENDERS)
            samples: dict[tuple[str, int], list[Round]] = {}
            for _ in range(rounds):
                for senders, batch in ((1, requests[:alone_count]), (SENDERS, requests)):
                    for kind, server in servers.items():
                        measured = measure(kind, server, batch, client, pool, senders)
                        samples.setdefault((kind, senders), []).append(measured)
        finally:
            for process, _ in servers.values():
                process.terminate()
                process.wait(timeout=20)
            client.close()
    fields = ("p50", "p99", "rate", "server_cpu", "sender_busy")
    median = {key: Round(*(statistics.median(getattr(r, f) for r in runs) for f in fields))
              for key, runs in samples.items()}
    print(f"webhook  {per_round:,} deliveries a round at {SENDERS} senders ({alone_count:,} at 1), median of {rounds}"
          f" rounds; senders in {SENDER_PROCESSES} processes of their own", flush=True)
    print(f"  {'':<8} {'senders':>7} {'p50 ms':>8} {'p99 ms':>8} {'deliveries/s':>13} {'server CPU':>11}"
          f" {'sender CPU':>11}")
    for (kind, senders), r in sorted(median.items(), key=lambda item: (item[0][1], item[0][0])):
        print(f"  {kind:<8} {senders:>7} {r.p50 * 1e3:8.2f} {r.p99 * 1e3:8.2f} {r.rate:13,.0f}"
              f" {r.server_cpu * 1e6:8.0f} µs {r.sender_busy:10.0%}")
    results = []
    for senders in (1, SENDERS):
        bare, tasuki = median[("bare", senders)], median[("tasuki", senders)]
        ratio = tasuki.rate / bare.rate
        label = f"@{senders}"  # senders; a short name keeps the summary table aligned
        met = ratio >= TARGET_RATE_RATIO if senders == SENDERS else None
        results += [
            Result(f"webhook deliveries/s vs bare {label}", f"{ratio:.2f}",
                   f">= {TARGET_RATE_RATIO}" if met is not None else "-", met),
            Result(f"webhook p50 vs bare {label}", f"{tasuki.p50 / bare.p50:.2f}x", "-", None),
            Result(f"webhook p99 vs bare {label}", f"{tasuki.p99 / bare.p99:.2f}x", "-", None),
        ]
    for result in results:
        print(f"  {result.name:<34} {result.ratio}", flush=True)
    return results


def main() -> None:
    """``python -m bench.bench_webhook [--quick]`` (``--serve`` is the server processes' entry)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run, not a measurement")
    parser.add_argument("--serve", choices=["bare", "tasuki"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--redis", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.redis, args.scratch)
        return
    with tempfile.TemporaryDirectory(prefix="tasuki-bench-") as scratch:
        run(Path(scratch), quick=args.quick)


if __name__ == "__main__":
    main()
