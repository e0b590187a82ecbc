"""A TCP forwarder of the tests' own between a process and a server (Redis), that a test cuts and restores.

with TcpProxy("127.0.0.1", 6379) as proxy:
    url = f"redis://127.0.0.1:{proxy.port}/3"   # the worker talks to Redis through it
    proxy.cut()       # every open connection is reset, new ones are refused until ...
    proxy.restore()   # ... connections are forwarded again

Real sockets and threads: a cut is what a client sees when the network between it and Redis goes away and
comes back (its connections fail at once rather than hang, so no test waits on a client's timeout).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from types import TracebackType

BUFFER = 65536


class TcpProxy:
    """Forwards connections on ``127.0.0.1:port`` to ``target_host:target_port`` while not cut."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        self.cuts = 0  # connections refused or reset while cut (a test can check the cut was felt)
        self._acceptor = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)
        self._acceptor.start()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def cut(self) -> None:
        """Reset every forwarded connection and refuse new ones until :meth:`restore`."""
        with self._lock:
            self._cut = True
            sockets, self._open = list(self._open), set()
        for sock in sockets:
            _reset(sock)

    def restore(self) -> None:
        """Forward new connections again."""
        with self._lock:
            self._cut = False

    def close(self) -> None:
        """Stop listening and drop every connection."""
        with self._lock:
            self._closed = True
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._acceptor.join(timeout=5)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    _reset(client)
                    return
                refused = self._cut
                if refused:
                    self.cuts += 1
            if refused:
                _reset(client)
                continue
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            _reset(client)
            return
        upstream.settimeout(None)
        with self._lock:
            if self._cut:
                self.cuts += 1
                _reset(client)
                _reset(upstream)
                return
            self._open.update((client, upstream))
        threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
        threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy bytes one way until either side closes (or the proxy resets both)."""
    try:
        while data := source.recv(BUFFER):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        _reset(source)
        _reset(sink)


def _reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), as a broken network path looks to the peer, not a polite FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()
