"""A server answering every POST with one status and JSON body on 127.0.0.1: an error or a reply exactly as some
real server sends it, for the shapes the replay model does not speak (llama.cpp's, vLLM's, LM Studio's errors).

with canned_server(400, {"error": {...}}) as fake:   # fake.url, fake.posts (the JSON bodies received)
    ...
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any


class Canned:
    """The running server: ``url`` and the bodies it was sent (``posts``)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.posts: list[Any] = []
        posts = self.posts

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                posts.append(json.loads(self.rfile.read(length) or b"null"))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: object) -> None:
                pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        """Stop serving and close the socket."""
        self._httpd.shutdown()
        self._httpd.server_close()


@contextlib.contextmanager
def canned_server(status: int, body: dict[str, Any]) -> Iterator[Canned]:
    """A canned server while the block runs."""
    server = Canned(status, body)
    try:
        yield server
    finally:
        server.close()
