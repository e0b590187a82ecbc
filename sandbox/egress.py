"""The task's egress proxy (``sandbox.network: full`` and ``allowlist``, SPEC §17): an HTTP(S) proxy on the host.

The design of Anthropic's sandbox-runtime on Linux: the sandbox has an empty network namespace, and its only way
out is a unix socket bound into it (``sandbox.jail`` bridges a loopback port to it with socat and points the
usual proxy variables there). This proxy listens on that socket, in a directory of its own (0700), and admits

- ``CONNECT host:port`` (HTTPS, and anything else tunnelled): bytes both ways, each direction closed on its own;
- absolute-URI plain-HTTP requests (``GET http://host/path``): sent on to the host as one request on a fresh
  connection (``Connection: close``), the answer piped back;

as its :class:`EgressPolicy` says, in two steps. The name: with ``allowlist`` it must be in
``sandbox.allowed_hosts`` (:func:`host_allowed`; a refused name is never resolved); with ``full`` any name passes.
The address: the proxy resolves the name itself and refuses every address that is not public (loopback, private,
link-local, CGNAT, ...: :func:`internal_kind`) unless ``sandbox.allowed_internal`` names it, then connects to the
very address it checked (no second lookup a rebinding DNS server could answer otherwise). A refusal gets ``403``
with a one-line body and is reported (host, port, time, why).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ipaddress
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import structlog

from contexts.clock import iso
from contexts.errors import TasukiError
from sandbox import bridge

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
    """One request the policy refused: where it wanted to go, when (epoch seconds), and why (one phrase)."""

    host: str
    port: int
    at: float
    reason: str


Address = ipaddress.IPv4Address | ipaddress.IPv6Address
NOT_ALLOWED = "not in sandbox.allowed_hosts"
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT: a provider's inside, not the internet
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # the well-known NAT64 prefix: its last 32 bits are an IPv4 address


@dataclass(frozen=True)
class InternalRange:
    """One entry of ``sandbox.allowed_internal``: a network, and optionally the one port admitted in it."""

    network: ipaddress.IPv4Network | ipaddress.IPv6Network
    port: int | None = None

    def holds(self, address: Address, port: int) -> bool:
        """Whether ``address:port`` is in this range."""
        return address.version == self.network.version and address in self.network and self.port in (None, port)


def internal_range(text: str) -> InternalRange:
    """``NETWORK`` or ``NETWORK:PORT``, the network in CIDR form (``10.1.2.0/24``, ``127.0.0.1/32:5432``,
    ``fd00::/8:443``; a bare address is the one address). ValueError when it is not one."""
    network, port = text.strip(), None
    if "/" in network:
        address, _, rest = network.partition("/")
        prefix, colon, port_text = rest.partition(":")
        network = f"{address}/{prefix}"
        if colon:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise ValueError(f"{text!r}: the port after the prefix must be 1-65535")
            port = int(port_text)
    try:
        return InternalRange(ipaddress.ip_network(network.strip("[]"), strict=True), port)
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a network in CIDR form, optionally with :PORT ({exc})") from None


def internal_kind(address: Address) -> str | None:
    """What makes ``address`` internal (``"loopback"``, ``"private"``, ...), or None for a public address. An IPv4
    address written as IPv6 (``::ffff:127.0.0.1``, or behind the NAT64 prefix) is judged as the IPv4 address."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped
        if embedded is None and address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            kind = internal_kind(embedded)
            return None if kind is None else f"{kind} (IPv4 {embedded} inside IPv6)"
    for kind, found in (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("shared (CGNAT 100.64.0.0/10)", address in _SHARED),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
        ("not public", not address.is_global),
    ):
        if found:
            return kind
    return None


@dataclass(frozen=True)
class EgressPolicy:
    """What a task's proxy admits. ``hosts``: the names it may reach (``sandbox.allowed_hosts``, network
    ``allowlist``), or None for any name (network ``full``). Either way an address that is not public is refused
    unless one of ``internal`` (``sandbox.allowed_internal``) holds it."""

    hosts: tuple[str, ...] | None
    internal: tuple[InternalRange, ...] = ()

    def refuses_name(self, host: str) -> str | None:
        """Why ``host`` (the name as the client wrote it, never resolved) is refused, or None."""
        if self.hosts is None or host_allowed(host, self.hosts):
            return None
        return NOT_ALLOWED

    def refuses_address(self, address: Address, port: int) -> str | None:
        """Why connecting to ``address:port`` is refused, or None."""
        kind = internal_kind(address)
        if kind is None or any(entry.holds(address, port) for entry in self.internal):
            return None
        return f"{address} is {kind}, not in sandbox.allowed_internal"


def egress_policy(network: str, allowed_hosts: Sequence[str], allowed_internal: Sequence[str]) -> EgressPolicy | None:
    """The proxy's policy for ``network`` (``full``: any public host; ``allowlist``: ``allowed_hosts``), or None
    for ``none``, which has no way out at all."""
    if network == "none":
        return None
    internal = tuple(internal_range(entry) for entry in allowed_internal)
    return EgressPolicy(None if network == "full" else tuple(allowed_hosts), internal)


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


async def _resolve(host: str, port: int) -> list[Address]:
    """``host``'s addresses, in the resolver's order (an address literal is itself): what the policy checks and the
    proxy connects to."""
    literal = _address(host)
    if literal is not None:
        return [literal]
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    found: list[Address] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]))
        if address not in found:
            found.append(address)
    return found


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
        try:
            admitted = await self._admitted(request.host, request.port)
        except (OSError, TimeoutError) as exc:
            await _answer(writer, 502, f"cannot resolve {request.host}: {exc or 'timed out'}")
            return
        if isinstance(admitted, str):
            self._refused(request.host, request.port, admitted)
            await _answer(writer, 403, f"egress to {request.host} refused: {admitted}")
            await _discard(reader)
            return
        try:
            up_reader, up_writer = await self._open(admitted, request.port)
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

    async def _admitted(self, host: str, port: int) -> list[Address] | str:
        """The addresses of ``host`` the policy admits, or why it refuses them all. A refused name is not resolved;
        an admitted one is resolved here, once: the proxy connects to what it checked (no DNS rebinding)."""
        refused = self.policy.refuses_name(host)
        if refused is not None:
            return refused
        addresses = await asyncio.wait_for(_resolve(host, port), CONNECT_TIMEOUT_S)
        reasons = [self.policy.refuses_address(address, port) for address in addresses]
        admitted = [address for address, reason in zip(addresses, reasons, strict=True) if reason is None]
        return admitted or next((reason for reason in reasons if reason), f"{host} has no address")

    async def _open(self, addresses: Sequence[Address], port: int) -> Upstream:
        """A connection to the first of ``addresses`` (each one checked) that answers: by address, never by name."""
        failure: BaseException = OSError("no address")
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            for address in addresses:
                try:
                    return await self.open_upstream(str(address), port)
                except OSError as exc:
                    failure = exc
        raise failure

    def _refused(self, host: str, port: int, reason: str) -> None:
        refusal = Refusal(host=host, port=port, at=self.clock(), reason=reason)
        log.warning("egress refused", host=host, port=port, reason=reason)
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
def egress_proxy(policy: EgressPolicy | None, on_refused: Callable[[Refusal], None]) -> Iterator[Path | None]:
    """The socket of a proxy with ``policy`` for one task (or one setup); None without a policy (network ``none``:
    no way out). The proxy stops when the block ends."""
    if policy is None:
        yield None
        return
    with EgressProxy(policy, on_refused) as proxy:
        try:
            yield proxy.socket
        finally:
            bridge.stop(proxy.socket)  # the task's network namespace, if a call made it, goes with its way out


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
            entry["reason"] = refusal.reason
            entries = [dict(e) for e in self._entries.values()]
        self.on_change(entries)
