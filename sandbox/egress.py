"""The egress allow-list (``sandbox.network: allowlist``, SPEC §17): an HTTP(S) proxy on the host, per task.

The design of Anthropic's sandbox-runtime on Linux: the sandbox has an empty network namespace, and its only way
out is a unix socket bound into it (``sandbox.jail`` bridges a loopback port to it with socat and points the
usual proxy variables there). This proxy listens on that socket, in a directory of its own (0700), and admits

- ``CONNECT host:port`` (HTTPS, and anything else tunnelled): bytes both ways, each direction closed on its own;
- absolute-URI plain-HTTP requests (``GET http://host/path``): sent on to the host as one request on a fresh
  connection (``Connection: close``), the answer piped back;

when ``host`` is allowed (:func:`host_allowed`); anything else gets ``403`` with a one-line body, and the refusal is
reported (host, port, time). A refused host is never resolved: the decision is taken on the name as written.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ipaddress
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import structlog

from contexts.clock import iso
from contexts.errors import TasukiError

log = structlog.get_logger(__name__)

SOCKET_NAME = "egress.sock"
HEAD_LIMIT = 64 * 1024  # a request line and headers larger than this are refused (431)
HEAD_TIMEOUT_S = 30.0  # a client that sends no complete request head in this time is dropped
CONNECT_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 900.0  # a relay with no byte either way for this long is closed (a peer that vanished)
START_TIMEOUT_S = 10.0
_CHUNK = 64 * 1024
_HOSTNAME = re.compile(r"^[a-z0-9_]([a-z0-9_.-]{0,251}[a-z0-9_])?$")
# Headers meant for the proxy (or this hop), never passed on; Host is written anew.
_HOP_HEADERS = frozenset({b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive", b"host"})

Upstream = tuple[asyncio.StreamReader, asyncio.StreamWriter]
OpenUpstream = Callable[[str, int], Awaitable[Upstream]]


class EgressError(TasukiError):
    """The egress proxy could not start."""


@dataclass(frozen=True)
class Refusal:
    """One request the allow-list refused: where it wanted to go, and when (epoch seconds)."""

    host: str
    port: int
    at: float


class EgressPolicy(Protocol):
    """What decides whether a destination may be reached."""

    def admits(self, host: str, port: int) -> bool:
        """Whether ``host:port`` (the name as the client wrote it, never resolved) may be reached."""
        ...


@dataclass(frozen=True)
class AllowList:
    """``sandbox.allowed_hosts``: exact names, ``*.example.org`` for its subdomains, IP literals as listed."""

    hosts: tuple[str, ...]

    def admits(self, host: str, port: int) -> bool:
        """Any port of an allowed host."""
        return host_allowed(host, self.hosts)


def host_allowed(host: str, allowed: Sequence[str]) -> bool:
    """Whether ``host`` is one of ``allowed`` (case-insensitive; ``*.x`` matches names below ``x``, not ``x``)."""
    name = _normal(host)
    address = _address(name)
    for entry in allowed:
        pattern = _normal(entry)
        if address is not None:  # an IP literal is admitted only when listed as one
            if _address(pattern) == address:
                return True
        elif pattern.startswith("*."):
            if name.endswith(pattern[1:]) and len(name) > len(pattern) - 1:
                return True
        elif name == pattern:
            return True
    return False


def _normal(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host[:-1] if host.endswith(".") else host


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _valid_host(host: str) -> bool:
    return _address(host) is not None or bool(_HOSTNAME.match(host))


async def _open_tcp(host: str, port: int) -> Upstream:
    return await asyncio.open_connection(host, port, limit=_CHUNK)


class EgressProxy:
    """The proxy of one task: :meth:`start` it (a thread with its own event loop), give the sandbox
    :attr:`socket`, :meth:`close` it when the task ends (every open connection is closed with it)."""

    def __init__(
        self,
        policy: EgressPolicy,
        on_refused: Callable[[Refusal], None],
        *,
        open_upstream: OpenUpstream = _open_tcp,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self.on_refused = on_refused
        self.open_upstream = open_upstream  # the only place a destination is resolved and reached
        self.idle_timeout_s = idle_timeout_s
        self.clock = clock
        self.directory: Path | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def socket(self) -> Path:
        """The unix socket the sandbox connects to."""
        if self.directory is None:
            raise EgressError("the egress proxy is not started")
        return self.directory / SOCKET_NAME

    def start(self) -> Path:
        """Listen; returns the socket's path. Raises EgressError when it cannot."""
        self.directory = Path(tempfile.mkdtemp(prefix="tasuki-egress-"))  # 0700; short: a socket path has 108 bytes
        # The thread runs in a copy of this context: its log lines carry the task's bound fields (its uuid).
        self._thread = threading.Thread(
            target=contextvars.copy_context().run, args=(self._main,), name="tasuki-egress", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S) or self._failure is not None:
            self.close()
            raise EgressError(f"the egress proxy did not start: {self._failure or 'no answer'}")
        return self.socket

    def close(self) -> None:
        """Stop listening, close every connection, remove the socket's directory. Safe to call twice."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(START_TIMEOUT_S)
            self._thread = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> EgressProxy:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- the proxy's thread --------------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except Exception as exc:  # told to start(), which raises it as one line
            self._failure = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_unix_server(self._accept, path=str(self.socket), limit=HEAD_LIMIT)
        self.socket.chmod(0o600)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # noqa: S101 - a server callback runs in a task
        self._connections.add(task)
        try:
            await self._handle(reader, writer)
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            pass  # a client or destination that went away: nothing to answer
        except Exception as exc:  # one connection's bug must not reach the loop, nor the other connections
            log.warning("egress connection failed", error=f"{type(exc).__name__}: {exc}"[:300])
        finally:
            self._connections.discard(task)
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            await _answer(writer, 431, "request head too large")
            return
        request = _parse(head)
        if isinstance(request, str):
            await _answer(writer, 400, request)
            return
        if not self.policy.admits(request.host, request.port):
            self._refused(request.host, request.port)
            await _answer(writer, 403, f"egress to {request.host} refused: not in sandbox.allowed_hosts")
            await _discard(reader)
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                self.open_upstream(request.host, request.port), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            await _answer(writer, 502, f"cannot reach {request.host}:{request.port}: {exc or 'timed out'}")
            return
        try:
            if request.forward is None:  # CONNECT
                writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            else:
                up_writer.write(request.forward)
            await self._relay(reader, writer, up_reader, up_writer, tunnel=request.forward is None)
        finally:
            up_writer.close()

    def _refused(self, host: str, port: int) -> None:
        refusal = Refusal(host=host, port=port, at=self.clock())
        log.warning("egress refused", host=host, port=port)
        try:
            self.on_refused(refusal)
        except Exception as exc:  # a recorder's failure must not take the proxy down
            log.warning("egress refusal not recorded", error=str(exc)[:300])

    async def _relay(
        self,
        client: asyncio.StreamReader,
        to_client: asyncio.StreamWriter,
        upstream: asyncio.StreamReader,
        to_upstream: asyncio.StreamWriter,
        *,
        tunnel: bool,
    ) -> None:
        """Pipe both ways until both ends closed (a tunnel) or the answer ended (a plain request); an idle relay
        or a reset on either side ends it."""
        activity = [time.monotonic()]
        out = asyncio.ensure_future(_pump(client, to_upstream, activity))
        back = asyncio.ensure_future(_pump(upstream, to_client, activity))
        pending: set[asyncio.Future[None]] = {out, back}
        try:
            while pending:
                done, pending = await asyncio.wait(
                    pending, timeout=self.idle_timeout_s / 4, return_when=asyncio.FIRST_COMPLETED
                )
                if any(task.exception() is not None for task in done):
                    return  # a reset: the other direction cannot go on either
                if (not tunnel and back in done) or time.monotonic() - activity[0] > self.idle_timeout_s:
                    return
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter, activity: list[float]) -> None:
    """Copy until end of file, then close ``sink``'s writing half (the other direction goes on)."""
    while chunk := await source.read(_CHUNK):
        activity[0] = time.monotonic()
        sink.write(chunk)
        await sink.drain()  # backpressure: a slow reader slows the writer, memory stays bounded
        activity[0] = time.monotonic()
    if sink.can_write_eof() and not sink.is_closing():
        sink.write_eof()


async def _discard(reader: asyncio.StreamReader, limit: int = 1 << 20) -> None:
    """Read what the client still sends (a refused request's body) so closing does not reset the answer away."""
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(5.0):
            read = 0
            while read < limit and (chunk := await reader.read(_CHUNK)):
                read += len(chunk)


async def _answer(writer: asyncio.StreamWriter, status: int, line: str) -> None:
    reasons = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large", 502: "Bad Gateway"}
    body = f"tasuki: {line}\n".encode()
    writer.write(
        f"HTTP/1.1 {status} {reasons[status]}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()


@dataclass(frozen=True)
class _Request:
    host: str
    port: int
    forward: bytes | None  # the head to send on (plain HTTP); None for CONNECT


def _header(line: bytes) -> bytes:
    return line.split(b":", 1)[0].strip().lower()


def _parse(head: bytes) -> _Request | str:
    """The destination of a proxy request's head, or why it is not one (a one-line answer)."""
    line, _, headers = head.partition(b"\r\n")
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
        return "not an HTTP request"
    method, target, version = (part.decode("latin-1") for part in parts)
    if method == "CONNECT":
        where = urlsplit(f"//{target}")
    elif target.startswith("http://"):
        where = urlsplit(target)
    else:
        return "only CONNECT and absolute http:// requests are proxied"
    try:
        host, port = (where.hostname or ""), where.port
    except ValueError:
        return f"bad port in {target!r}"
    if not host or not _valid_host(host):
        return f"bad host in {target!r}"
    if method == "CONNECT":
        return "CONNECT needs host:port" if port is None else _Request(host, port, None)
    path = where.path or "/"
    if where.query:
        path += f"?{where.query}"
    # Host is the one the allow-list admitted, whatever the client wrote (no reaching another site of a shared server).
    named = f"[{host}]" if ":" in host else host
    kept = [f"Host: {named}" + (f":{port}" if port is not None else "")]
    kept += [h.decode("latin-1") for h in headers.split(b"\r\n") if h and _header(h) not in _HOP_HEADERS]
    forward = "".join(f"{h}\r\n" for h in [f"{method} {path} {version}", *kept]).encode("latin-1")
    return _Request(host, port or 80, forward + b"Connection: close\r\n\r\n")


@contextlib.contextmanager
def egress_proxy(
    network: str, allowed_hosts: Sequence[str], on_refused: Callable[[Refusal], None]
) -> Iterator[Path | None]:
    """The socket of a proxy for one task (or one setup) whose network is ``allowlist``; None for ``full`` and
    ``none``, which need no proxy. The proxy stops when the block ends."""
    if network != "allowlist":
        yield None
        return
    with EgressProxy(AllowList(tuple(allowed_hosts)), on_refused) as proxy:
        yield proxy.socket


class RefusalLog:
    """A task's refusals, one entry per ``host:port`` (count, first and last time), at most ``limit`` entries;
    ``on_change`` gets the entries (JSON-ready, for ``state.json``) after each refusal; ``recorded``: those of an
    earlier attempt of the task, counted on. Thread-safe."""

    def __init__(
        self,
        on_change: Callable[[list[dict[str, Any]]], None],
        recorded: Sequence[dict[str, Any]] = (),
        limit: int = 50,
    ) -> None:
        self.on_change = on_change
        self.limit = limit
        self._entries = {(str(e["host"]), int(e["port"])): dict(e) for e in recorded if "host" in e and "port" in e}
        self._lock = threading.Lock()

    def add(self, refusal: Refusal) -> None:
        """Count one refusal."""
        at = iso(datetime.fromtimestamp(refusal.at, UTC))
        with self._lock:
            key = (refusal.host.lower(), refusal.port)
            entry = self._entries.get(key)
            if entry is None:
                if len(self._entries) >= self.limit:
                    return
                entry = self._entries[key] = {"host": key[0], "port": key[1], "count": 0, "first_at": at}
            entry["count"] = int(entry.get("count") or 0) + 1
            entry["last_at"] = at
            entries = [dict(e) for e in self._entries.values()]
        self.on_change(entries)
