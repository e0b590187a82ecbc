"""A fake Anthropic Messages API over HTTP: the replay model's scripted answers, validated and billed like Claude's.

The same trajectory that drives the replay model through the OpenAI and Ollama protocols answers here at
``POST /v1/messages`` (non-streaming): a request is turned into OpenAI-style messages for
:class:`replay.model.ReplayModel`, whose turn, faults, delays and gates apply unchanged.

What makes it more than a translator, so a test can fail the way the real API would fail:

- **Validation** as the API does it, with its error shape (``{"type": "error", "error": {"type":
  "invalid_request_error", "message": ...}}``): required fields, unknown fields, roles and block types, empty text,
  at most four ``cache_control`` breakpoints (none on thinking blocks or empty text), every ``tool_use`` answered by a
  ``tool_result`` in the next message and every ``tool_result`` naming a ``tool_use`` of the previous one, tool
  results first in their message, thinking's budget and temperature, thinking blocks first and with the signature
  this server gave them. With thinking on, the assistant turn that opened the current tool loop must start with
  its thinking blocks (the API's rule); the fake is stricter about earlier turns, which the API would strip:
  every assistant turn it answered with thinking must carry those blocks, unchanged and first, so a provider
  that drops them anywhere is caught.
- **Usage** by Anthropic's caching rules (:mod:`replay.anthropic_cache`): ``input_tokens``,
  ``cache_read_input_tokens`` and ``cache_creation_input_tokens`` computed from the request's breakpoints.
- **Failures** as Claude reports them: a scripted 429 ``rate_limit_error`` (with the fault's headers, a
  ``retry-after``), a storm of them (``ReplayModel.start_storm``), 529 ``overloaded_error``, 5xx ``api_error``, and
  400 "prompt is too long: N tokens > M maximum" past the configured window.

with serve_anthropic(ReplayModel(turns), context_window=200_000) as fake:
    anthropic.Anthropic(api_key="k", base_url=fake.url)   # fake.requests: the log, with each answer's usage
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from contexts.tokens import estimate_tokens
from replay.anthropic_cache import (
    MAX_BREAKPOINTS,
    CacheUsage,
    PromptCache,
    breakpoint_count,
    content_blocks,
    prefix_blocks,
)
from replay.model import Answer, ReplayModel
from replay.rules import conversation_key

MESSAGES_PATH = "/v1/messages"
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
_BODY_KEYS = {
    "model", "max_tokens", "messages", "system", "tools", "tool_choice", "thinking", "temperature", "top_p",
    "top_k", "stop_sequences", "stream", "metadata", "output_config", "cache_control", "service_tier",
    "container", "inference_geo", "speed", "diagnostics",
}  # fmt: skip
_BLOCK_KEYS = {
    "text": {"type", "text", "cache_control", "citations"},
    "tool_use": {"type", "id", "name", "input", "cache_control"},
    "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control"},
    "thinking": {"type", "thinking", "signature"},
    "redacted_thinking": {"type", "data"},
    "image": {"type", "source", "cache_control"},
    "document": {"type", "source", "title", "context", "citations", "cache_control"},
}
_TOOL_KEYS = {"name", "description", "input_schema", "cache_control", "type", "strict", "input_examples"}
THINKING_TYPES = ("thinking", "redacted_thinking")
_THINKING_RULE = (
    "When `thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding the "
    "lastmost set of `tool_use` and `tool_result` blocks). We recommend you include thinking blocks from previous "
    "turns. To avoid this requirement, disable `thinking`."
)


class RequestError(Exception):
    """A request the API would refuse: its HTTP status, error type and message."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def error_body(status: int, message: str, request_id: str = "req_fake") -> dict[str, Any]:
    """An error in Anthropic's shape, so the official client raises its usual exception."""
    kind = ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id}


class Signer:
    """Signs the thinking this server writes and checks what comes back (the API's signatures are opaque too)."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def signature(self, thinking: str) -> str:
        """The signature of a thinking block's text."""
        mac = hmac.new(self._secret, thinking.encode(), hashlib.sha256).digest()
        return base64.b64encode(mac).decode()

    def redacted(self, thinking: str) -> str:
        """A redacted_thinking block's ``data``: the thinking, sealed."""
        sealed = json.dumps({"thinking": thinking, "mac": self.signature(thinking)})
        return base64.b64encode(sealed.encode()).decode()

    def valid(self, block: dict[str, Any]) -> bool:
        """Whether a thinking or redacted_thinking block is one this server wrote, unchanged."""
        if block.get("type") == "thinking":
            signature = block.get("signature")
            return isinstance(signature, str) and hmac.compare_digest(
                signature, self.signature(str(block.get("thinking") or ""))
            )
        try:
            sealed = json.loads(base64.b64decode(str(block.get("data") or ""), validate=True))
        except ValueError:
            return False
        return isinstance(sealed, dict) and hmac.compare_digest(
            str(sealed.get("mac")), self.signature(str(sealed.get("thinking")))
        )


def validate(body: Any, signer: Signer) -> None:
    """Raise :class:`RequestError` for a body the Messages API would refuse (see the module's docstring)."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    for key in ("model", "max_tokens", "messages"):
        if key not in body:
            raise RequestError(f"{key}: Field required")
    for key in sorted(body.keys() - _BODY_KEYS):
        raise RequestError(f"{key}: Extra inputs are not permitted")
    if not isinstance(body["max_tokens"], int) or body["max_tokens"] < 1:
        raise RequestError("max_tokens: Input should be a valid integer greater than or equal to 1")
    if body.get("stream"):
        raise RequestError("stream: this fake answers non-streaming requests only")
    _validate_tools(body.get("tools"))
    _validate_system(body.get("system"))
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: at least one message is required")
    for index, message in enumerate(messages):
        _validate_message(index, message, final=index == len(messages) - 1, signer=signer)
    _validate_tool_pairs(messages)
    count = breakpoint_count(body)
    if count > MAX_BREAKPOINTS:
        raise RequestError(f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {count}.")
    _validate_thinking(body)


def _validate_tools(tools: Any) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise RequestError("tools: Input should be a valid list")
    names: set[str] = set()
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise RequestError(f"tools.{index}.name: Field required")
        for key in sorted(tool.keys() - _TOOL_KEYS):
            raise RequestError(f"tools.{index}.{key}: Extra inputs are not permitted")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise RequestError(f"tools.{index}.input_schema.type: Input should be 'object'")
        if tool["name"] in names:
            raise RequestError(f"tools: Tool names must be unique. Found duplicate: {tool['name']}")
        names.add(tool["name"])


def _validate_system(system: Any) -> None:
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        raise RequestError("system: Input should be a valid string or list of text blocks")
    for index, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise RequestError(f"system.{index}.type: Input should be 'text'")
        _validate_text(f"system.{index}", block)


def _validate_text(where: str, block: dict[str, Any]) -> None:
    text = block.get("text")
    if not isinstance(text, str):
        raise RequestError(f"{where}.text: Field required")
    if not text:
        raise RequestError(f"{where}.text: text content blocks must be non-empty")
    if not text.strip():
        raise RequestError(f"{where}.text: text content blocks must contain non-whitespace text")


def _validate_message(index: int, message: Any, *, final: bool, signer: Signer) -> None:
    where = f"messages.{index}"
    if not isinstance(message, dict):
        raise RequestError(f"{where}: Input should be a valid dictionary")
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise RequestError(f"{where}.role: Input should be 'user' or 'assistant'")
    for key in sorted(message.keys() - {"role", "content"}):
        raise RequestError(f"{where}.{key}: Extra inputs are not permitted")
    content = message.get("content")
    empty = content in ("", []) or content is None
    if empty and not (final and role == "assistant"):
        raise RequestError(f"{where}: all messages must have non-empty content except for the optional final "
                           "assistant message")  # fmt: skip
    if isinstance(content, str) or empty:
        return
    if not isinstance(content, list):
        raise RequestError(f"{where}.content: Input should be a valid string or list")
    seen_other = False
    for position, block in enumerate(content):
        _validate_block(f"{where}.content.{position}", role, block, signer, after_other=seen_other)
        seen_other = seen_other or block["type"] not in THINKING_TYPES


def _validate_block(at: str, role: str, block: Any, signer: Signer, *, after_other: bool) -> None:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind not in _BLOCK_KEYS:
        raise RequestError(f"{at}: Input tag '{kind}' found using 'type' does not match any of the expected tags")
    for key in sorted(block.keys() - _BLOCK_KEYS[kind]):
        raise RequestError(f"{at}.{kind}.{key}: Extra inputs are not permitted")
    if kind == "text":
        _validate_text(at, block)
    if kind in THINKING_TYPES:
        if role != "assistant":
            raise RequestError(f"{at}: thinking blocks may only appear in assistant messages")
        if after_other:
            raise RequestError(f"{at}: thinking blocks must come before any other block of the message")
        if not signer.valid(block):
            field = "signature" if kind == "thinking" else "data"
            raise RequestError(f"{at}: Invalid `{field}` in `{kind}` block")
    if kind == "tool_use" and role != "assistant":
        raise RequestError(f"{at}: tool_use blocks may only appear in assistant messages")
    if kind == "tool_result" and role != "user":
        raise RequestError(f"{at}: tool_result blocks may only appear in user messages")


def _validate_tool_pairs(messages: list[dict[str, Any]]) -> None:
    for index, message in enumerate(messages):
        blocks = content_blocks(message.get("content"))
        if message["role"] == "assistant":
            asked = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
            following = content_blocks(messages[index + 1].get("content")) if index + 1 < len(messages) else []
            answered = {str(b.get("tool_use_id")) for b in following if b.get("type") == "tool_result"}
            missing = [call for call in asked if call not in answered]
            if missing:
                raise RequestError(
                    f"messages.{index}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                    f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block in "
                    "the next message."
                )
            continue
        kinds = [b.get("type") for b in blocks]
        if "tool_result" in kinds and any(k != "tool_result" for k in kinds[: kinds.count("tool_result")]):
            raise RequestError(f"messages.{index}: `tool_result` blocks must come first in the message content, "
                               "before any other block")  # fmt: skip
        previous = content_blocks(messages[index - 1].get("content")) if index > 0 else []
        asked_before = {str(b.get("id")) for b in previous if b.get("type") == "tool_use"}
        for position, block in enumerate(blocks):
            if block.get("type") == "tool_result" and str(block.get("tool_use_id")) not in asked_before:
                raise RequestError(
                    f"messages.{index}.content.{position}: unexpected `tool_use_id` found in `tool_result` blocks: "
                    f"{block.get('tool_use_id')}. Each `tool_result` block must have a corresponding `tool_use` "
                    "block in the previous message."
                )


def _validate_thinking(body: dict[str, Any]) -> None:
    thinking = body.get("thinking")
    if not thinking_on(body):
        return
    assert isinstance(thinking, dict)  # noqa: S101 (thinking_on checked it)
    if thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or budget < 1024:
            raise RequestError("thinking.enabled.budget_tokens: Input should be greater than or equal to 1024")
        if budget >= body["max_tokens"]:
            raise RequestError("`max_tokens` must be greater than `thinking.budget_tokens`")
    if body.get("temperature") not in (None, 1, 1.0):
        raise RequestError("`temperature` may only be set to 1 when thinking is enabled or in adaptive mode")
    messages = body["messages"]
    last = content_blocks(messages[-1].get("content"))
    if messages[-1]["role"] == "user" and any(b.get("type") == "tool_result" for b in last) and len(messages) > 1:
        opener = content_blocks(messages[-2].get("content"))
        if messages[-2]["role"] == "assistant" and opener and opener[0].get("type") not in THINKING_TYPES:
            raise RequestError(
                f"messages.{len(messages) - 2}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
                f"`{opener[0].get('type')}`. {_THINKING_RULE}"
            )


def thinking_on(body: dict[str, Any]) -> bool:
    """Whether the request asks for thinking (``enabled`` with a budget, or ``adaptive``)."""
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


def replay_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request as OpenAI-style messages, what :class:`ReplayModel` reads to pick its turn."""
    out: list[dict[str, Any]] = []
    system = "\n\n".join(str(b.get("text", "")) for b in content_blocks(body.get("system")))
    if system:
        out.append({"role": "system", "content": system})
    for message in body["messages"]:
        blocks = content_blocks(message.get("content"))
        text = "\n".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
        if message["role"] == "assistant":
            calls = [
                {
                    "id": b.get("id"),
                    "type": "function",
                    "function": {"name": b.get("name"), "arguments": b.get("input")},
                }
                for b in blocks
                if b.get("type") == "tool_use"
            ]
            out.append({"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})})
            continue
        for block in blocks:
            if block.get("type") == "tool_result":
                result = block.get("content")
                if isinstance(result, list):
                    result = "\n".join(str(part.get("text", "")) for part in result if isinstance(part, dict))
                out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": result or ""})
        if text:
            out.append({"role": "user", "content": text})
    return out


class AnthropicFake:
    """The fake's state: the replay model answering, the prompt cache, the thinking it signed and handed out."""

    def __init__(
        self,
        model: ReplayModel,
        *,
        context_window: int = 200_000,
        min_cacheable_tokens: int | None = None,
        redacted_thinking: bool = False,
        api_key: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.context_window = context_window
        self.redacted_thinking = redacted_thinking
        self.api_key = api_key
        self.cache = PromptCache(min_cacheable_tokens)
        self.signer = Signer(hashlib.sha256(f"tasuki-fake-{id(self)}".encode()).digest())
        self._clock = clock
        self._lock = threading.Lock()
        self._issued: dict[tuple[str, str], list[dict[str, Any]]] = {}  # (conversation, tool_use id) -> thinking
        self._ids = itertools.count(1)

    def handle(self, path: str, headers: dict[str, str], body: Any) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Status, JSON body and extra headers of the answer to one POST."""
        request_id = f"req_fake_{next(self._ids):06d}"
        entry = self.model.record("POST", path, body)
        status, payload, extra = self._answer(path, headers, body, entry, request_id)
        extra["request-id"] = request_id
        self.model.note(entry, status=status, **({"error": payload["error"]["message"]} if status != 200 else {}))
        return status, payload, extra

    def _answer(
        self, path: str, headers: dict[str, str], body: Any, entry: dict[str, Any], request_id: str
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        try:
            self._admit(path, headers, body)
        except RequestError as exc:
            return exc.status, error_body(exc.status, str(exc), request_id), {}
        messages = replay_messages(body)
        answer = self.model.answer(messages, entry)
        if answer.status != 200:
            return answer.status, error_body(answer.status, answer.error or "error", request_id), dict(answer.headers)
        with self._lock:
            usage = self.cache.use(body, self._clock())
        content = self._content(answer, body, conversation_key(messages))
        output = sum(estimate_tokens(json.dumps(block, ensure_ascii=False)) for block in content)
        self.model.note(entry, prompt_tokens=usage.prompt_tokens, usage=usage_record(usage, output))
        return 200, self._message(answer, body, content, usage, output, request_id), {}

    def _admit(self, path: str, headers: dict[str, str], body: Any) -> None:
        """Raise :class:`RequestError` for a request the API refuses before any model sees it."""
        if path != MESSAGES_PATH:
            raise RequestError(f"Not found: {path}", 404)
        if not headers.get("x-api-key") and not headers.get("authorization"):
            raise RequestError("x-api-key header is required", 401)
        if self.api_key is not None and headers.get("x-api-key") != self.api_key:
            raise RequestError("invalid x-api-key", 401)
        if not headers.get("anthropic-version"):
            raise RequestError("anthropic-version: header is required")
        validate(body, self.signer)
        self._check_thinking_kept(body)
        prompt = sum(block.tokens for block in prefix_blocks(body))
        if prompt > self.context_window:
            raise RequestError(f"prompt is too long: {prompt} tokens > {self.context_window} maximum")

    def _check_thinking_kept(self, body: dict[str, Any]) -> None:
        """Stricter than the API: every assistant turn answered here with thinking carries it, unchanged, first."""
        if not thinking_on(body):
            return
        key = conversation_key(replay_messages(body))
        for index, message in enumerate(body["messages"]):
            if message["role"] != "assistant":
                continue
            blocks = content_blocks(message.get("content"))
            ids = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
            with self._lock:
                issued = next((self._issued[(key, i)] for i in ids if (key, i) in self._issued), None)
            if issued is not None and blocks[: len(issued)] != issued:
                found = blocks[0].get("type") if blocks else "nothing"
                raise RequestError(
                    f"messages.{index}.content.0.type: Expected the `thinking` blocks this turn was answered with, "
                    f"but found `{found}`. {_THINKING_RULE}"
                )

    def _content(self, answer: Answer, body: dict[str, Any], conversation: str) -> list[dict[str, Any]]:
        content: list[dict[str, Any]] = []
        if thinking_on(body):
            thought = f"Turn {answer.turn}: the request asks for {answer.kind} work; I answer as scripted."
            content.append({"type": "thinking", "thinking": thought, "signature": self.signer.signature(thought)})
            if self.redacted_thinking:
                content.append({"type": "redacted_thinking", "data": self.signer.redacted(thought + " (hidden)")})
        if answer.content:
            content.append({"type": "text", "text": answer.content})
        content.extend(
            {"type": "tool_use", "id": cid, "name": name, "input": args} for cid, name, args in answer.tool_calls
        )
        thoughts = [block for block in content if block["type"] in THINKING_TYPES]
        if thoughts:
            with self._lock:
                for cid, _, _ in answer.tool_calls:
                    self._issued[(conversation, cid)] = thoughts
        return content

    def _message(
        self,
        answer: Answer,
        body: dict[str, Any],
        content: list[dict[str, Any]],
        usage: CacheUsage,
        output: int,
        request_id: str,
    ) -> dict[str, Any]:
        return {
            "id": f"msg_{request_id.removeprefix('req_')}",
            "type": "message",
            "role": "assistant",
            "model": str(body.get("model")),
            "content": content,
            "stop_reason": "tool_use" if answer.tool_calls else "end_turn",
            "stop_sequence": None,
            "usage": usage_record(usage, output),
        }


def usage_record(usage: CacheUsage, output_tokens: int) -> dict[str, int]:
    """A response's ``usage`` object."""
    return {
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
        "cache_read_input_tokens": usage.cache_read_input_tokens,
        "output_tokens": output_tokens,
    }


class _Handler(BaseHTTPRequestHandler):
    server: _FakeHTTPServer
    protocol_version = "HTTP/1.1"
    timeout = 120
    wbufsize = 1 << 16
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the fake's request log has every request."""

    def do_POST(self) -> None:
        """A Messages request (any other path is a 404 in the API's shape)."""
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        headers = {key.lower(): value for key, value in self.headers.items()}
        status, payload, extra = self.server.fake.handle(urlsplit(self.path).path, headers, body)
        data = json.dumps(payload, ensure_ascii=False).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in extra.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass


class _FakeHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], fake: AnthropicFake) -> None:
        self.fake = fake
        super().__init__(address, _Handler)


class AnthropicServer:
    """A running fake: ``url`` is the client's ``base_url``; ``requests`` the log (body, status, usage, error)."""

    def __init__(self, fake: AnthropicFake, httpd: _FakeHTTPServer) -> None:
        self.fake = fake
        self._httpd = httpd
        host, port = httpd.server_address[:2]
        self.url = f"http://{host!s}:{int(port)}"
        self._stopped = False
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="anthropic-fake", daemon=True
        )
        self._thread.start()

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every request so far: ``body``, ``status``, ``kind``, ``turn``, ``usage`` (answers), ``error`` (refusals)."""
        return self.fake.model.snapshot()

    def stop(self) -> None:
        """Stop serving; requests held by a delay or a gate are released. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        self.fake.model.stop()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> AnthropicServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_anthropic(model: ReplayModel, host: str = "127.0.0.1", port: int = 0, **options: Any) -> AnthropicServer:
    """Serve ``model`` as the Anthropic Messages API in a background thread (``options``: see
    :class:`AnthropicFake`)."""
    fake = AnthropicFake(model, **options)
    return AnthropicServer(fake, _FakeHTTPServer((host, port), fake))
