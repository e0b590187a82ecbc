"""A per-user settings service (``GET /config/{user}``) as a real HTTP server, for user_config_api tests."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class UserConfigServer:
    """``GET /config/{user}`` answering from a dict: a JSON body, or an int for a bare HTTP status."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.hits: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

            def setup(self) -> None:
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_GET(self) -> None:
                outer.hits.append(self.path)
                answer = outer.answers.get(self.path.removeprefix("/config/"), 404)
                status, body = (answer, b"") if isinstance(answer, int) else (200, json.dumps(answer).encode())
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
