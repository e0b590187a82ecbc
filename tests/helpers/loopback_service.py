"""A service on the host's 127.0.0.1 answering every GET with one body: what the fleet's Redis, PostgreSQL or intake
is to a worker, for the tests that try to reach it from the sandbox."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def serve_text(body: str) -> Iterator[int]:
    """Serve ``body`` on an unused port of 127.0.0.1 while the block runs; the port."""
    data = body.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
