"""git's smart HTTP protocol for the fake forge: ``git http-backend`` (CGI) over bare repositories."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path
from typing import Any

# The user name each forge's token goes with (Gitea reads a token as the password whatever the name).
GIT_USERS = {"github": "x-access-token", "gitlab": "oauth2", "gitea": "tasuki"}


def git_authorized(authorization: str, token: str) -> bool:
    """Whether ``Authorization`` is Basic with a forge's git user name and ``token``."""
    return git_password(authorization) == token


def git_password(authorization: str) -> str | None:
    """The token of ``Authorization: Basic`` with a forge's git user name; None for anything else."""
    scheme, _, encoded = authorization.partition(" ")
    if scheme != "Basic":
        return None
    try:
        user, _, password = base64.b64decode(encoded).decode().partition(":")
    except ValueError:
        return None
    return password if user in GIT_USERS.values() else None


def git_backend(git_root: Path, method: str, path: str, query: str, headers: Any,
                body: bytes) -> tuple[int, dict[str, str], bytes]:
    """Run one request through ``git http-backend``; its status, headers and body."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GIT_PROJECT_ROOT": str(git_root),
        "GIT_HTTP_EXPORT_ALL": "1",
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "REQUEST_METHOD": method,
        "CONTENT_TYPE": headers.get("Content-Type", ""),
        "CONTENT_LENGTH": str(len(body)),
        "REMOTE_USER": "tasuki",  # an authenticated user may push (http.receivepack defaults to it)
        "REMOTE_ADDR": "127.0.0.1",
    }
    for header in ("Git-Protocol", "Content-Encoding"):
        if headers.get(header):
            env["HTTP_" + header.upper().replace("-", "_")] = headers[header]
    done = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, check=False)
    head, _, payload = done.stdout.partition(b"\r\n\r\n")
    status, out_headers = 200, {}
    for line in head.decode("latin-1").split("\r\n"):
        name, _, value = line.partition(":")
        if name.lower() == "status":
            status = int(value.strip().split()[0])
        elif name:
            out_headers[name] = value.strip()
    return status, out_headers, payload
