"""The replay model's server: serve a :class:`~replay.model.ReplayModel` over HTTP, in a thread or as a process.

python -m replay (--trajectory FILE | --messages FILE | --context-dir DIR | --routes FILE) [--host H] [--port P]
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from http.server import HTTPServer
from pathlib import Path
from typing import Any

from replay.http import ReplayHTTPServer
from replay.model import ReplayModel
from replay.trajectory import load_trajectory


class ReplayServer:
    """A running replay model: ``url`` is the Ollama host, ``openai_base_url`` the OpenAI ``base_url``."""

    def __init__(self, model: ReplayModel, httpd: HTTPServer) -> None:
        self.model = model
        self._httpd = httpd
        host, port = httpd.server_address[:2]
        self.host = str(host)
        self.port = int(port)
        self.url = f"http://{self.host}:{self.port}"
        self.openai_base_url = f"{self.url}/v1"
        self._stopped = False
        # A short poll interval makes stop() quick: shutdown() waits for the serving loop's next poll.
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="replay-model", daemon=True
        )
        self._thread.start()

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every request received so far (method, path, body, prompt_tokens, kind, turn, status)."""
        return self.model.snapshot()

    def stop(self) -> None:
        """Stop serving and close the socket; waiting requests are released. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        self.model.stop()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> ReplayServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(model: ReplayModel, host: str = "127.0.0.1", port: int = 0) -> ReplayServer:
    """Start serving ``model`` in a background thread; ``port=0`` picks a free port."""
    return ReplayServer(model, ReplayHTTPServer((host, port), model))


def run_replay_model(
    trajectory_path: Path | None, messages_path: Path | None, port: int, host: str = "127.0.0.1",
    routes_path: Path | None = None,
) -> None:
    """Serve a trajectory (or an earlier run's ``messages.jsonl``, or a routes file of per-task trajectories,
    :mod:`replay.oracle`) until SIGTERM or Ctrl-C; prints the URL."""
    source = trajectory_path or messages_path
    if routes_path is not None:
        from replay.oracle import load_routes

        default, routes = load_routes(routes_path)
        model = ReplayModel(default, routes=routes)
    elif source is None:
        raise ValueError("run_replay_model needs a trajectory, a messages.jsonl or a routes file")
    else:
        model = ReplayModel(load_trajectory(source))
    server = serve(model, host, port)
    print(server.url, flush=True)  # the first stdout line: how a parent process finds the port
    stopped = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        while not stopped.wait(3600):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m replay (--trajectory FILE | --messages FILE | --context-dir DIR | --routes FILE) [--port P]``."""
    parser = argparse.ArgumentParser(prog="tasuki replay-model", description="Serve the replay model.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trajectory", type=Path, help="scripted trajectory (JSONL or YAML)")
    source.add_argument("--messages", type=Path, help="messages.jsonl of an earlier run")
    source.add_argument("--context-dir", type=Path, help="context directory of an earlier run")
    source.add_argument("--routes", type=Path, help="per-task trajectories chosen by the task's text (replay.oracle)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    messages = args.messages
    if args.context_dir is not None:
        from contexts.names import GZIP_SUFFIX, MESSAGES_FILE

        messages = args.context_dir / MESSAGES_FILE
        if not messages.exists():
            messages = messages.with_name(MESSAGES_FILE + GZIP_SUFFIX)
    try:
        run_replay_model(args.trajectory, messages, args.port, args.host, routes_path=args.routes)
    except (OSError, ValueError) as exc:
        print(f"tasuki replay-model: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
