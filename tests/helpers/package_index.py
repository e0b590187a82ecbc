"""A PEP 503 simple index on loopback serving wheels the test makes: pip installs for real, never from the internet.

with package_index() as index:
    index.add(make_wheel(tmp_path, "tinypkg", "1.0", {"tinypkg/__init__.py": "VALUE = 42\\n"}))
    ... pip install --index-url {index.url} tinypkg ...
    index.requests  # every path asked for, in order
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
import threading
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# A loopback address outside the sandbox's NO_PROXY (127.0.0.1): a sandboxed pip reaches the index through the task's
# egress proxy, which admits it only with sandbox.allowed_internal naming it (INDEX_INTERNAL; docs/security.md).
INDEX_HOST = "127.0.1.1"
INDEX_INTERNAL = f"{INDEX_HOST}/32"


def normalize(name: str) -> str:
    """PEP 503's normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def make_wheel(directory: Path, name: str, version: str, files: Mapping[str, str]) -> Path:
    """A pure-Python wheel of ``files`` (path -> text) with its METADATA, WHEEL and RECORD, written with zipfile."""
    dist = re.sub(r"[-.]+", "_", name)
    info = f"{dist}-{version}.dist-info"
    contents = {
        **{path: text.encode() for path, text in files.items()},
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tasuki-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    contents[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in contents.items():
            archive.writestr(path, data)
    return wheel


class PackageIndex:
    """The served wheels by project, and the request log."""

    def __init__(self) -> None:
        self.wheels: dict[str, list[Path]] = {}
        self.requests: list[str] = []
        self.url = ""
        self._lock = threading.Lock()

    def add(self, wheel: Path) -> None:
        """Serve ``wheel`` under its project's name."""
        project = normalize(wheel.name.split("-", 1)[0])
        with self._lock:
            self.wheels.setdefault(project, []).append(wheel)

    def logged(self, path: str) -> None:
        with self._lock:
            self.requests.append(path)

    def page(self, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for one GET."""
        parts = [p for p in path.split("?", 1)[0].split("/") if p]
        if parts == ["simple"]:
            links = "".join(f'<a href="/simple/{p}/">{p}</a>\n' for p in sorted(self.wheels))
            return 200, "text/html", f"<!DOCTYPE html><html><body>\n{links}</body></html>".encode()
        if len(parts) == 2 and parts[0] == "simple" and normalize(parts[1]) in self.wheels:
            links = ""
            for wheel in self.wheels[normalize(parts[1])]:
                digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
                links += f'<a href="/files/{html.escape(wheel.name)}#sha256={digest}">{html.escape(wheel.name)}</a>\n'
            return 200, "text/html", f"<!DOCTYPE html><html><body>\n{links}</body></html>".encode()
        if len(parts) == 2 and parts[0] == "files":
            for wheel in (w for wheels in self.wheels.values() for w in wheels):
                if wheel.name == parts[1]:
                    return 200, "application/octet-stream", wheel.read_bytes()
        return 404, "text/plain", b"not found\n"


@contextmanager
def package_index(host: str = INDEX_HOST) -> Iterator[PackageIndex]:
    """A running index on a free port (``index.url`` is its ``/simple`` root), stopped on exit."""
    index = PackageIndex()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            index.logged(self.path)
            status, kind, body = index.page(self.path)
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer((host, 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    index.url = f"http://{host}:{server.server_address[1]}/simple"
    try:
        yield index
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
