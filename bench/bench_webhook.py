"""Webhook intake latency (p50, p99) and deliveries/s with 50 concurrent senders, against a bare route.

Both servers are uvicorn processes with the same settings; the baseline is a FastAPI route that only
answers 200. Every Tasuki delivery is a signed ``issues.labeled`` example for a new issue, so it takes the
whole path: read the body, verify HMAC-SHA256, parse, classify, dedupe (``SET NX``), mark the task key
active, publish ``tasuki.run_task`` to Redis, answer 202. The senders speak raw HTTP/1.1 on keep-alive
connections so that the client costs as little as possible of what is measured.

``python -m bench.bench_webhook [--quick]``; the servers run as ``python -m bench.bench_webhook --serve``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid as uuid_module
from pathlib import Path

import redis

from bench.common import Result
from bench.worker_stack import private_redis

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = REPO_ROOT / "tests" / "fixtures" / "webhooks" / "github" / "issues.labeled.json"
SECRET = "bench-webhook-secret"  # noqa: S105 - a throwaway secret of the benchmark's own servers
SENDERS = 50
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
            "GITHUB_WEBHOOK_SECRET": SECRET,
        },
    )
    celery = Celery("tasuki-bench")
    celery.conf.update(celery_config(settings))
    return create_app(settings, redis.Redis.from_url(redis_url), celery)


def serve(kind: str, port: int, redis_url: str, scratch: Path) -> None:
    """Child process: run one of the two apps until terminated."""
    import uvicorn

    from worker.logging import configure_logging

    configure_logging("INFO", json=True)  # as `tasuki webhook` logs: a JSON line per enqueued task
    app = bare_app() if kind == "bare" else tasuki_app(redis_url, scratch)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)  # type: ignore[arg-type]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(kind: str, redis_url: str, scratch: Path) -> tuple[subprocess.Popen[bytes], int]:
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


async def _send_all(port: int, requests: list[bytes], latencies: list[float], statuses: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
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


async def _round(port: int, requests: list[bytes], senders: int) -> tuple[list[float], float, list[int]]:
    latencies: list[float] = []
    statuses: list[int] = []
    share = [requests[i::senders] for i in range(senders)]
    start = time.perf_counter()
    await asyncio.gather(*(_send_all(port, part, latencies, statuses) for part in share))
    return latencies, time.perf_counter() - start, statuses


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def measure(
    kind: str, port: int, requests: list[bytes], client: redis.Redis, senders: int = SENDERS
) -> tuple[float, float, float]:
    """p50 and p99 latency (s) and deliveries/s of one round; Redis is emptied before it."""
    client.flushdb()  # the benchmark's own private Redis
    latencies, elapsed, statuses = asyncio.run(_round(port, requests, senders))
    expected = 202 if kind == "tasuki" else 200
    wrong = [s for s in statuses if s != expected]
    if wrong:
        raise RuntimeError(f"{kind}: {len(wrong)} answers were not {expected}, e.g. {wrong[0]}")
    return percentile(latencies, 0.5), percentile(latencies, 0.99), len(requests) / elapsed


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Measure both servers in alternating rounds; print and return p50, p99 and throughput ratios."""
    per_round = 1_000 if quick else 5_000
    rounds = 1 if quick else 5
    scratch.mkdir(parents=True, exist_ok=True)
    requests = deliveries(per_round)
    with private_redis(scratch / "redis") as redis_url:
        client = redis.Redis.from_url(redis_url)
        servers = {kind: start_server(kind, redis_url, scratch) for kind in ("bare", "tasuki")}
        try:
            warm = requests[: SENDERS * 4]
            for kind, (_, port) in servers.items():
                measure(kind, port, warm, client)
            # One sender: the answer time of a single delivery, nothing queued before it.
            alone = {
                kind: measure(kind, port, requests[:200], client, senders=1)[0] for kind, (_, port) in servers.items()
            }
            samples: dict[str, list[tuple[float, float, float]]] = {"bare": [], "tasuki": []}
            for _ in range(rounds):
                for kind, (_, port) in servers.items():
                    samples[kind].append(measure(kind, port, requests, client))
        finally:
            for process, _ in servers.values():
                process.terminate()
                process.wait(timeout=20)
            client.close()
    median = {kind: tuple(statistics.median(s[i] for s in runs) for i in range(3)) for kind, runs in samples.items()}
    (bare_p50, bare_p99, bare_rate), (p50, p99, rate) = median["bare"], median["tasuki"]
    print(f"webhook  {SENDERS} senders, {per_round:,} deliveries a round, median of {rounds} rounds", flush=True)
    print(f"  bare route   p50 {bare_p50 * 1e3:7.2f} ms  p99 {bare_p99 * 1e3:7.2f} ms  {bare_rate:9,.0f}/s")
    print(f"  tasuki       p50 {p50 * 1e3:7.2f} ms  p99 {p99 * 1e3:7.2f} ms  {rate:9,.0f}/s")
    print(f"  one sender   p50 bare {alone['bare'] * 1e3:.2f} ms, tasuki {alone['tasuki'] * 1e3:.2f} ms")
    results = [
        Result("webhook p50 alone vs bare", f"{alone['tasuki'] / alone['bare']:.2f}x", "-", None),
        Result("webhook p50 latency vs bare", f"{p50 / bare_p50:.2f}x", "-", None),
        Result("webhook p99 latency vs bare", f"{p99 / bare_p99:.2f}x", "-", None),
        Result("webhook deliveries/s vs bare", f"{rate / bare_rate:.2f}", "-", None),
    ]
    for result in results:
        print(f"  {result.name:<30} {result.ratio}", flush=True)
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
