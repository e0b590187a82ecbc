"""The replay model's HTTP face: OpenAI ``/v1/chat/completions``, ``/v1/responses`` (:mod:`replay.responses_api`)
and ``/v1/embeddings``, Ollama ``/api/chat`` and ``/api/embed``; non-streaming."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from contexts.tokens import estimate_tokens
from replay.embeddings import embedding_inputs, ollama_embeddings, openai_embeddings
from replay.responses_api import OVERFLOW_MESSAGE, RESPONSES_PATHS, ResponsesFake
from replay.rules import cached_prompt_tokens

if TYPE_CHECKING:
    from replay.model import Answer, ReplayModel

MODEL_NAME = "tasuki-replay"
OPENAI_CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
OLLAMA_CHAT_PATH = "/api/chat"
OPENAI_EMBEDDING_PATHS = ("/v1/embeddings", "/embeddings")
OLLAMA_EMBED_PATH = "/api/embed"
GATES_PATH = "/_gates/"  # POST /_gates/NAME [{containing}] opens a gate; GET /_gates lists them (tests only)
_OPENAI_ERROR_TYPES = {429: "rate_limit_error", 400: "invalid_request_error"}
_CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "cookie"})


class ReplayHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server that knows its replay model; request threads never block shutdown."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], model: ReplayModel) -> None:
        self.replay_model = model
        self.responses = ResponsesFake(model)
        super().__init__(address, ReplayHandler)


def _usage_of(answer: Answer) -> int:
    calls = [{"name": name, "arguments": arguments} for _, name, arguments in answer.tool_calls]
    return estimate_tokens(answer.content) + (estimate_tokens(json.dumps(calls)) if calls else 0)


def usage_of(answer: Answer, prompt_tokens: int, cached_tokens: int) -> dict[str, int]:
    """What one answer is reported to cost, in OpenAI's terms (the request log keeps it for tests)."""
    completion_tokens = _usage_of(answer)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "cached_tokens": min(cached_tokens, prompt_tokens),
        "total_tokens": prompt_tokens + completion_tokens,
    }


def openai_completion(answer: Answer, model: str, usage: dict[str, int]) -> dict[str, Any]:
    """A ``chat.completion`` object as the OpenAI API returns it (usage with its cached prompt tokens)."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.content}
    if answer.thinking:
        message["reasoning_content"] = answer.thinking  # as vLLM, llama.cpp and DeepSeek return a thinking model's
    if answer.tool_calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
            for cid, name, arguments in answer.tool_calls
        ]
    return {
        "id": f"chatcmpl-replay-{answer.kind}-{answer.turn if answer.turn is not None else 's'}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if answer.tool_calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": usage["prompt_tokens"],
            "completion_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"],
            "prompt_tokens_details": {"cached_tokens": usage["cached_tokens"]},
        },
    }


def ollama_chat(answer: Answer, model: str, usage: dict[str, int], think: object = None) -> dict[str, Any]:
    """A final (``done: true``) ``/api/chat`` response as Ollama returns it (Ollama reports no cached tokens);
    a thinking turn's thinking comes in ``message.thinking`` unless the request turned thinking off."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.content or ""}
    if answer.thinking and think is not False:
        message["thinking"] = answer.thinking
    if answer.tool_calls:
        message["tool_calls"] = [
            {"id": cid, "function": {"index": k, "name": name, "arguments": arguments}}
            for k, (cid, name, arguments) in enumerate(answer.tool_calls)
        ]
    return {
        "model": model,
        "created_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "message": message,
        "done_reason": "stop",
        "done": True,
        "total_duration": 0,
        "load_duration": 0,
        "prompt_eval_count": usage["prompt_tokens"],
        "prompt_eval_duration": 0,
        "eval_count": usage["completion_tokens"],
        "eval_duration": 0,
    }


def openai_error(status: int, message: str) -> dict[str, Any]:
    """An error as the OpenAI API shapes it, so its official client raises its usual exception."""
    kind = _OPENAI_ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def ollama_error(status: int, message: str) -> dict[str, Any]:
    """An error as Ollama shapes it."""
    return {"error": message}


@dataclass(frozen=True)
class Wire:
    """One API this module answers chat and embeddings in: how its answers and errors are shaped."""

    error: Callable[[int, str], dict[str, Any]]
    embeddings: Callable[[list[str], str], dict[str, Any]]
    chat: Callable[[Answer, str, dict[str, int], dict[str, Any]], dict[str, Any]]
    """``(answer, model name, usage, request body)``: a chat response."""
    hosted: bool
    """A hosted API's ways: a request to stream is refused (the replay model does not), the model's context window
    is enforced with the API's error, and cached prompt tokens are reported."""


OPENAI = Wire(openai_error, openai_embeddings, lambda answer, name, usage, _: openai_completion(answer, name, usage),
              hosted=True)
OLLAMA = Wire(ollama_error, ollama_embeddings,
              lambda answer, name, usage, body: ollama_chat(answer, name, usage, body.get("think")), hosted=False)


def embeddings_answer(wire: Wire, body: object) -> tuple[int, dict[str, Any]]:
    """Status and body of an embeddings request in either API (vectors from :mod:`replay.embeddings`)."""
    texts = embedding_inputs(body)
    if texts is None:
        return 400, wire.error(400, "the body must be JSON with an 'input' string or list of strings")
    model = str(body.get("model") or MODEL_NAME) if isinstance(body, dict) else MODEL_NAME
    return 200, wire.embeddings(texts, model)


class ReplayHandler(BaseHTTPRequestHandler):
    """Routes one HTTP request to the replay model and shapes its answer for the API that was called."""

    server: ReplayHTTPServer
    protocol_version = "HTTP/1.1"
    timeout = 120  # an idle keep-alive connection gives its thread back after this long
    # Headers and body in one write (a buffered wfile, flushed once per answer): written apart, the body
    # waited out the client's delayed ACK (~40 ms per call). No Nagle either, for answers beyond the buffer.
    wbufsize = 1 << 16
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: every request is in ``GET /_requests`` instead of on stderr."""

    def do_GET(self) -> None:
        """Model lists, version, liveness and the request log."""
        path = urlsplit(self.path).path
        model = self.server.replay_model
        if path == "/_requests":
            self._send_json(200, model.snapshot())
            return
        if path == "/_gates":
            self._send_json(200, model.gates())
            return
        entry = model.record("GET", path, None)
        listings: dict[str, Any] = {
            "/v1/models": {
                "object": "list",
                "data": [{"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "tasuki"}],
            },
            "/api/tags": {"models": [{"name": MODEL_NAME, "model": MODEL_NAME, "size": 0, "digest": ""}]},
            "/api/version": {"version": "0.0.0"},
            "/": {"status": "tasuki replay model is running"},
        }
        status = 200 if path in listings else 404
        model.note(entry, status=status)
        self._send_json(status, listings.get(path, openai_error(404, f"no route {path}")))

    def do_POST(self) -> None:
        """Chat completions in either API."""
        path = urlsplit(self.path).path
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        model = self.server.replay_model
        if path.startswith(GATES_PATH) and len(path) > len(GATES_PATH):
            containing = body.get("containing") if isinstance(body, dict) else None
            model.open_gate(path[len(GATES_PATH):], containing if isinstance(containing, str) else None)
            self._send_json(200, model.gates())
            return
        entry = model.record("POST", path, body)
        # The headers a client sent, for tests of a profile's extra headers; never its credentials.
        sent = {k.lower(): v for k, v in self.headers.items() if k.lower() not in _CREDENTIAL_HEADERS}
        model.note(entry, headers=sent)
        wire = OLLAMA if path in (OLLAMA_CHAT_PATH, OLLAMA_EMBED_PATH) else OPENAI
        usage: dict[str, int] | None = None
        headers: tuple[tuple[str, str], ...] = ()
        if path in (*OPENAI_EMBEDDING_PATHS, OLLAMA_EMBED_PATH):
            status, payload = embeddings_answer(wire, body)
            if status == 200:
                tokens = int(payload.get("prompt_eval_count") or payload.get("usage", {}).get("prompt_tokens") or 0)
                usage = {"prompt_tokens": tokens, "completion_tokens": 0, "cached_tokens": 0, "total_tokens": tokens}
        elif path in RESPONSES_PATHS:
            status, payload, usage, headers = self.server.responses.handle(body, entry)
        elif path not in (*OPENAI_CHAT_PATHS, OLLAMA_CHAT_PATH):
            status, payload = 404, wire.error(404, f"no route {path}")
        else:
            status, payload, usage, headers = self._chat(wire, body, entry)
        # The log keeps the usage of every answer given, so a test can compare what Tasuki counted with it.
        model.note(entry, status=status, usage=usage)
        # Ollama streams chat unless told not to; a replay answer is then one final NDJSON chunk.
        chat = path == OLLAMA_CHAT_PATH
        streamed = chat and status == 200 and isinstance(body, dict) and body.get("stream", True)
        self._send_json(status, payload, ndjson=bool(streamed), headers=headers)

    def _chat(
        self, wire: Wire, body: Any, entry: dict[str, Any]
    ) -> tuple[int, dict[str, Any], dict[str, int] | None, tuple[tuple[str, str], ...]]:
        """Status, body, usage and extra headers of a chat request in the OpenAI or Ollama API."""
        model = self.server.replay_model
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return 400, wire.error(400, "the body must be JSON with a 'messages' list"), None, ()
        if wire.hosted and body.get("stream"):
            return 400, wire.error(400, "the replay model does not stream"), None, ()
        if wire.hosted and model.context_window and entry["prompt_tokens"] > model.context_window:
            payload = wire.error(400, OVERFLOW_MESSAGE)
            payload["error"].update(param="messages", code="context_length_exceeded")
            return 400, payload, None, ()
        answer = model.answer(body["messages"], entry)
        if answer.status != 200:
            return answer.status, wire.error(answer.status, answer.error or "error"), None, answer.headers
        name = str(body.get("model") or MODEL_NAME)
        cached = cached_prompt_tokens(body["messages"]) if wire.hosted and answer.turn else 0
        usage = usage_of(answer, entry["prompt_tokens"], cached)
        return 200, wire.chat(answer, name, usage, body), usage, ()

    def _send_json(
        self, status: int, payload: Any, *, ndjson: bool = False, headers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode() + (b"\n" if ndjson else b"")
        try:
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Type", "application/x-ndjson" if ndjson else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client is gone (a killed worker); its resumed self will ask again
