"""Tasuki's replay model (SPEC §11): an HTTP server speaking the OpenAI and Ollama chat APIs from a trajectory.

Which turn a request gets is decided by the request alone, so the answer is deterministic and survives
both compression and a worker crash:

- every replayed answer's content opens with ``[tasuki-replay turn=N]`` and its tool calls have ids
  ``call_t{N}_{k}``; the agent writes both to ``messages.jsonl`` and sends them back in later prompts;
- a summary request (system prompt starting "You summarize") is answered with a summary that opens with
  the marker of the latest turn in its span, so the summary carries it once those turns are compressed;
- an agent request gets turn ``1 + the highest N`` named by any marker (system, user or assistant
  content; never tool output, which is untrusted) or replayed call id it contains, and turn 0 when none.

A resumed worker re-sends the conversation as it is on disk: if its reply to turn N was written before
the crash it gets N+1, otherwise N again. Only scripted faults and delays keep server-side state: each is
served once per conversation (keyed by the system prompt and the pinned task). A request past the last
turn gets HTTP 400 "replay trajectory exhausted".
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from dataclasses import dataclass
from http.server import HTTPServer
from pathlib import Path
from typing import Any

from worker.replay_rules import (
    call_id,
    conversation_key,
    is_summary_request,
    next_turn_index,
    prompt_token_estimate,
    replay_summary,
    turn_marker,
)
from worker.replay_trajectory import Turn, load_trajectory

__all__ = [
    "Answer",
    "ReplayModel",
    "ReplayServer",
    "Turn",
    "load_trajectory",
    "main",
    "run_replay_model",
    "serve",
]


@dataclass(frozen=True)
class Answer:
    """What the replay model says to one chat request: a turn, a summary, or an HTTP error."""

    kind: str  # "agent" or "summary"
    status: int = 200
    turn: int | None = None
    content: str | None = None
    tool_calls: tuple[tuple[str, str, dict[str, Any]], ...] = ()  # (id, name, arguments)
    error: str | None = None


class ReplayModel:
    """Answers chat requests from ``trajectory``; records every request for tests (``GET /_requests``)."""

    def __init__(self, trajectory: list[Turn]) -> None:
        self.trajectory = trajectory
        self.requests: list[dict[str, Any]] = []
        self._faults_served: dict[tuple[str, int], int] = {}
        self._delayed: set[tuple[str, int]] = set()
        self._summary_faults = [status for turn in trajectory for status in turn.summary_faults]
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def record(self, method: str, path: str, body: Any) -> dict[str, Any]:
        """Log a request on arrival; ``kind`` and ``turn`` are filled in when chosen, ``status`` when sent."""
        messages = body.get("messages") if isinstance(body, dict) else None
        entry: dict[str, Any] = {
            "method": method,
            "path": path,
            "body": body,
            "prompt_tokens": prompt_token_estimate(messages, body.get("tools")) if isinstance(messages, list) else 0,
            "kind": None,
            "turn": None,
            "status": None,
        }
        with self._lock:
            self.requests.append(entry)
        return entry

    def note(self, entry: dict[str, Any] | None, **fields: Any) -> None:
        """Fill in fields of a logged request (under the lock that ``snapshot`` takes)."""
        if entry is not None:
            with self._lock:
                entry.update(fields)

    def snapshot(self) -> list[dict[str, Any]]:
        """A copy of the request log, safe to serialize while requests keep arriving."""
        with self._lock:
            return [dict(entry) for entry in self.requests]

    def answer(self, messages: list[dict[str, Any]], entry: dict[str, Any] | None = None) -> Answer:
        """The answer to one chat request; waits out a scripted delay (``entry`` shows the turn meanwhile)."""
        if is_summary_request(messages):
            self.note(entry, kind="summary")
            return self._answer_summary(messages)
        index = next_turn_index(messages)
        self.note(entry, kind="agent", turn=index)
        if index >= len(self.trajectory):
            error = f"replay trajectory exhausted: it has {len(self.trajectory)} turns, turn {index} was asked for"
            return Answer("agent", status=400, turn=index, error=error)
        turn = self.trajectory[index]
        key = (conversation_key(messages), index)
        with self._lock:
            served = self._faults_served.get(key, 0)
            if served < len(turn.faults):
                self._faults_served[key] = served + 1
                return Answer("agent", status=turn.faults[served], turn=index, error="scripted failure")
            delay = turn.delay_s if key not in self._delayed else 0.0
            self._delayed.add(key)
        if delay:
            self._stopping.wait(delay)  # cut short when the server stops
        return Answer(
            "agent",
            turn=index,
            content=f"{turn_marker(index)} {turn.content or ''}".rstrip(),
            tool_calls=tuple(
                (call_id(index, k), call.name, dict(call.arguments)) for k, call in enumerate(turn.tool_calls)
            ),
        )

    def _answer_summary(self, messages: list[dict[str, Any]]) -> Answer:
        with self._lock:
            if self._summary_faults:
                return Answer("summary", status=self._summary_faults.pop(0), error="scripted failure")
        return Answer("summary", content=replay_summary(messages))

    def stop(self) -> None:
        """Release requests waiting out a delay."""
        self._stopping.set()


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
    from worker.replay_http import ReplayHTTPServer

    return ReplayServer(model, ReplayHTTPServer((host, port), model))


def run_replay_model(
    trajectory_path: Path | None, messages_path: Path | None, port: int, host: str = "127.0.0.1"
) -> None:
    """Serve a trajectory (or an earlier run's ``messages.jsonl``) until SIGTERM or Ctrl-C; prints the URL."""
    source = trajectory_path or messages_path
    if source is None:
        raise ValueError("run_replay_model needs a trajectory or a messages.jsonl path")
    server = serve(ReplayModel(load_trajectory(source)), host, port)
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
    """``python -m worker.replay (--trajectory FILE | --messages FILE | --context-dir DIR) [--port P]``."""
    parser = argparse.ArgumentParser(prog="tasuki replay-model", description="Serve the replay model.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trajectory", type=Path, help="scripted trajectory (JSONL or YAML)")
    source.add_argument("--messages", type=Path, help="messages.jsonl of an earlier run")
    source.add_argument("--context-dir", type=Path, help="context directory of an earlier run")
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
        run_replay_model(args.trajectory, messages, args.port, args.host)
    except (OSError, ValueError) as exc:
        print(f"tasuki replay-model: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
