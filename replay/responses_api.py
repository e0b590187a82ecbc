"""The replay model's OpenAI Responses API (``POST /v1/responses``, non-streaming, stateless only).

The same trajectory that answers Chat Completions and Ollama answers here: a request's ``instructions`` and
``input`` items are turned into OpenAI-style messages for :class:`replay.model.ReplayModel`, whose turns, faults,
delays and gates apply unchanged, and the answer comes back as a ``response`` object.

It refuses what the real API refuses with ``store: false``, in OpenAI's error shape, so a provider that gets the
protocol wrong fails here as it would there:

- every answer of a reasoning model (any but ``gpt-4*`` and ``gpt-3.5*``, unless ``reasoning.effort`` is
  ``none``) opens with a **reasoning item** whose ``encrypted_content`` this server sealed (an HMAC of the
  conversation, the turn and the item id); a later request must send back, before each function call of that
  answer, the reasoning item it came with, untouched (a dropped or altered item is a 400, in OpenAI's words
  "...was provided without its required 'reasoning' item" or "...could not be verified"). Stricter than the
  API, which links a call to its reasoning only through the call's item id (``fc_...``), which a client need
  not send: a provider that loses reasoning fails here even where OpenAI would quietly reason again;
- a reasoning item needs its ``encrypted_content`` (nothing is stored to look its id up) and an item after it;
- a ``function_call_output`` answers a ``function_call`` earlier in the input by ``call_id``, and every function
  call has its output;
- unknown parameters, ``store`` other than false, tools in Chat Completions' shape, strict tools whose schema is
  not strict, out-of-range ``temperature`` and ``max_output_tokens``, unknown efforts;
- a prompt past the model's ``context_window`` (``context_length_exceeded``).

Usage follows OpenAI's prompt caching: the input tokens of the longest prefix (tools, instructions, then input
items) this request shares with an earlier one of the same ``prompt_cache_key`` are reported as
``input_tokens_details.cached_tokens``, from 1024 tokens up in steps of 128.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import re
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any

from contexts.tokens import estimate_tokens
from replay.rules import conversation_key

if TYPE_CHECKING:
    from replay.model import Answer, ReplayModel

RESPONSES_PATHS = ("/v1/responses", "/responses")
CACHE_MIN_TOKENS = 1024  # OpenAI caches prompts from this long...
CACHE_STEP_TOKENS = 128  # ...and serves them from the cache in steps of this many tokens
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
PARAMETERS = frozenset(
    {
        "background", "context_management", "conversation", "include", "input", "instructions",
        "max_output_tokens", "max_tool_calls", "metadata", "model", "parallel_tool_calls", "previous_response_id",
        "prompt", "prompt_cache_key", "prompt_cache_retention", "reasoning", "safety_identifier", "service_tier",
        "store", "stream", "stream_options", "temperature", "text", "tool_choice", "tools", "top_logprobs",
        "top_p", "truncation", "user",
    }
)  # fmt: skip
"""The request body's parameters (``ResponseCreateParams``); any other is an "Unknown parameter"."""
NON_REASONING_MODELS = re.compile(r"(gpt-4|gpt-3\.5|chatgpt-4o)")  # they answer with no reasoning items
OVERFLOW_MESSAGE = "Your input exceeds the context window of this model. Please adjust your input and try again."


class RequestError(Exception):
    """A request the API refuses before any model sees it: an HTTP status and OpenAI's error object."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The error as OpenAI sends it."""
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}}


class Sealer:
    """Seals and checks the ``encrypted_content`` of the reasoning items this server hands out."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def seal(self, conversation: str, turn: str, item_id: str) -> str:
        """An opaque blob naming the conversation, the turn and the item, with its MAC."""
        payload = json.dumps([conversation, turn, item_id]).encode()
        mac = hmac.new(self._secret, payload, hashlib.sha256).digest()[:16]
        return "gAAAA" + base64.urlsafe_b64encode(payload + mac).decode()

    def opens(self, blob: object, conversation: str, item_id: str) -> bool:
        """Whether ``blob`` is a seal of this server for item ``item_id`` of ``conversation``."""
        if not isinstance(blob, str) or not blob.startswith("gAAAA"):
            return False
        try:
            raw = base64.urlsafe_b64decode(blob[5:].encode())
        except ValueError:
            return False
        payload, mac = raw[:-16], raw[-16:]
        if not hmac.compare_digest(mac, hmac.new(self._secret, payload, hashlib.sha256).digest()[:16]):
            return False
        try:
            sealed_conversation, _turn, sealed_id = json.loads(payload)
        except (ValueError, TypeError):
            return False
        return bool(sealed_conversation == conversation and sealed_id == item_id)


def _item_type(item: dict[str, Any]) -> str | None:
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"  # an EasyInputMessage may leave its type out
    return kind if isinstance(kind, str) else None


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def input_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's ``input`` as items (a bare string is one user message)."""
    raw = body.get("input")
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    return [item for item in raw or [] if isinstance(item, dict)]


def replay_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request as the OpenAI-style messages the replay model reads: instructions as the system prompt,
    function calls folded into their assistant message, outputs as tool messages."""
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    for item in input_items(body):
        kind = _item_type(item)
        if kind == "message":
            messages.append({"role": item.get("role"), "content": _text(item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")},
            }
            last = messages[-1] if messages else None
            if last is not None and last.get("role") == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": _text(item.get("output"))})
    return messages


def validate(body: Any) -> None:
    """Raise :class:`RequestError` for a body the API refuses whatever the conversation."""
    if not isinstance(body, dict):
        raise RequestError("We could not parse the JSON body of your request.")
    for name in body:
        if name not in PARAMETERS:
            raise RequestError(f"Unknown parameter: '{name}'.", param=name, code="unknown_parameter")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise RequestError("Missing required parameter: 'model'.", param="model", code="missing_required_parameter")
    if not isinstance(body.get("input"), str | list):
        raise RequestError("Missing required parameter: 'input'.", param="input", code="missing_required_parameter")
    if body.get("store") is not False:
        raise RequestError("The replay Responses API is stateless: send store: false.", param="store")
    if body.get("stream"):
        raise RequestError("the replay model does not stream", param="stream")
    if body.get("previous_response_id") or body.get("conversation"):
        raise RequestError("Nothing is stored with store: false: send the whole conversation as input.")
    _validate_options(body)
    for index, tool in enumerate(body.get("tools") or []):
        _validate_tool(index, tool)


def _validate_options(body: dict[str, Any]) -> None:
    temperature = body.get("temperature")
    if temperature is not None and (not isinstance(temperature, int | float) or not 0 <= temperature <= 2):
        raise RequestError(
            f"Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got {temperature}.",
            param="temperature",
            code="decimal_above_max_value",
        )
    cap = body.get("max_output_tokens")
    if cap is not None and (not isinstance(cap, int) or cap < 16):
        raise RequestError(
            f"Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but got {cap}.",
            param="max_output_tokens",
            code="integer_below_min_value",
        )
    reasoning = body.get("reasoning")
    if reasoning is not None:
        effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
        if effort is not None and effort not in EFFORTS:
            raise RequestError(
                f"Invalid value: '{effort}'. Supported values are: {', '.join(repr(e) for e in EFFORTS)}.",
                param="reasoning.effort",
                code="invalid_value",
            )


def _validate_tool(index: int, tool: Any) -> None:
    where = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise RequestError(f"Invalid value for '{where}.type': only function tools are served.", param=where)
    if not isinstance(tool.get("name"), str):
        # The mistake of sending Chat Completions' {"type": "function", "function": {...}} shape.
        raise RequestError(
            f"Missing required parameter: '{where}.name'.", param=f"{where}.name", code="missing_required_parameter"
        )
    if tool.get("strict", True) is False:
        return
    schema = tool.get("parameters") or {}
    properties = set((schema.get("properties") or {}).keys())
    missing = sorted(properties - set(schema.get("required") or []))
    name = tool["name"]
    if missing:
        raise RequestError(
            f"Invalid schema for function '{name}': In context=(), 'required' is required to be supplied and to be "
            f"an array including every key in properties. Missing '{missing[0]}'.",
            param=f"{where}.parameters",
            code="invalid_function_parameters",
        )
    if schema.get("additionalProperties") is not False:
        raise RequestError(
            f"Invalid schema for function '{name}': In context=(), 'additionalProperties' is required to be "
            "supplied and to be false.",
            param=f"{where}.parameters",
            code="invalid_function_parameters",
        )


class ResponsesFake:
    """The Responses API's state: the seals, the reasoning each function call came with, the prompt cache."""

    def __init__(self, model: ReplayModel, *, secret: bytes | None = None) -> None:
        self.model = model
        self.sealer = Sealer(secret or secrets.token_bytes(32))
        self._lock = threading.Lock()
        self._issued: dict[tuple[str, str], str] = {}  # (conversation, call_id) -> the reasoning item's id
        self._prefixes: dict[str, list[list[tuple[str, int]]]] = {}  # prompt_cache_key -> earlier prompts
        self._ids = itertools.count(1)

    def handle(
        self, body: Any, entry: dict[str, Any]
    ) -> tuple[int, dict[str, Any], dict[str, int] | None, tuple[tuple[str, str], ...]]:
        """Status, JSON body, usage (for the request log) and extra headers of the answer to one
        ``POST /v1/responses``."""
        try:
            validate(body)
            messages = replay_messages(body)
            conversation = conversation_key(messages)
            self._validate_items(input_items(body), conversation)
        except RequestError as exc:
            return exc.status, exc.body(), None, ()
        units = prompt_units(body)
        prompt_tokens = sum(tokens for _, tokens in units)
        self.model.note(entry, prompt_tokens=prompt_tokens)
        window = self.model.context_window
        if window is not None and prompt_tokens > window:
            overflow = RequestError(OVERFLOW_MESSAGE, param="input", code="context_length_exceeded")
            return 400, overflow.body(), None, ()
        answer = self.model.answer(messages, entry)
        if answer.status != 200:
            error = RequestError(answer.error or "error", status=answer.status).body()
            if answer.status == 429:
                error["error"]["type"] = "rate_limit_error"
            return answer.status, error, None, answer.headers
        cached = self._cached(body, units)
        output = self._output(answer, body, conversation)
        reasoning_tokens = sum(estimate_tokens(json.dumps(item)) for item in output if item["type"] == "reasoning")
        visible = sum(estimate_tokens(json.dumps(item)) for item in output if item["type"] != "reasoning")
        usage = {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": reasoning_tokens + visible,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": prompt_tokens + reasoning_tokens + visible,
        }
        logged = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": reasoning_tokens + visible,
            "cached_tokens": cached,
            "total_tokens": prompt_tokens + reasoning_tokens + visible,
        }
        return 200, self._response(body, output, usage), logged, ()

    def _validate_items(self, items: list[dict[str, Any]], conversation: str) -> None:
        calls: set[str] = set()
        answered: set[str] = set()
        for index, item in enumerate(items):
            kind = _item_type(item)
            if kind == "reasoning":
                self._validate_reasoning(index, items, conversation)
            elif kind == "function_call":
                call_id = str(item.get("call_id"))
                with self._lock:
                    required = self._issued.get((conversation, call_id))
                if required is not None and required not in _reasoning_before(items, index):
                    raise RequestError(
                        f"Item '{item.get('id') or call_id}' of type 'function_call' was provided without its "
                        f"required 'reasoning' item: '{required}'.",
                        param="input",
                    )
                calls.add(call_id)
            elif kind == "function_call_output":
                call_id = str(item.get("call_id"))
                if call_id not in calls:
                    raise RequestError(
                        f"No tool call found for function call output with call_id {call_id}.", param="input"
                    )
                answered.add(call_id)
            elif kind == "message":
                if item.get("role") not in ("user", "assistant", "system", "developer"):
                    raise RequestError(f"Invalid value: '{item.get('role')}'.", param=f"input[{index}].role")
            else:
                raise RequestError(f"Invalid value: '{item.get('type')}'.", param=f"input[{index}].type")
        unanswered = sorted(calls - answered)
        if unanswered:
            raise RequestError(f"No tool output found for function call {unanswered[0]}.", param="input")

    def _validate_reasoning(self, index: int, items: list[dict[str, Any]], conversation: str) -> None:
        item = items[index]
        item_id = str(item.get("id"))
        if not item.get("encrypted_content"):
            raise RequestError(
                f"Item with id '{item_id}' not found. Items are not persisted when `store` is set to false. Try "
                "again with `store` set to true, or remove this item from your input.",
                param="input",
            )
        if not self.sealer.opens(item["encrypted_content"], conversation, item_id):
            raise RequestError(
                f"The encrypted content for item {item_id} could not be verified.",
                param="input",
                code="invalid_encrypted_content",
            )
        following = items[index + 1] if index + 1 < len(items) else None
        if following is None or not (
            _item_type(following) == "function_call"
            or (_item_type(following) == "message" and following.get("role") == "assistant")
        ):
            raise RequestError(
                f"Item '{item_id}' of type 'reasoning' was provided without its required following item.",
                param="input",
            )

    def _output(self, answer: Answer, body: dict[str, Any], conversation: str) -> list[dict[str, Any]]:
        serial = next(self._ids)
        turn = f"t{answer.turn}" if answer.turn is not None else f"{answer.kind}{serial}"
        output: list[dict[str, Any]] = []
        reasoning: dict[str, Any] = body["reasoning"] if isinstance(body.get("reasoning"), dict) else {}
        if reasoning.get("effort") != "none" and not NON_REASONING_MODELS.match(str(body.get("model"))):
            item_id = f"rs_{turn}_{conversation[:8]}_{serial}"
            thought = answer.thinking or f"Turn {turn}: the request asks for {answer.kind} work; I answer as scripted."
            item: dict[str, Any] = {
                "id": item_id,
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": thought}] if reasoning.get("summary") else [],
                "encrypted_content": self.sealer.seal(conversation, turn, item_id),
            }
            output.append(item)
            with self._lock:
                for cid, _, _ in answer.tool_calls:
                    self._issued[(conversation, cid)] = item_id
        if answer.content:
            output.append(
                {
                    "id": f"msg_{turn}_{serial}",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": answer.content, "annotations": []}],
                }
            )
        output.extend(
            {
                "id": f"fc_{cid}",
                "type": "function_call",
                "status": "completed",
                "call_id": cid,
                "name": name,
                "arguments": json.dumps(arguments),
            }
            for cid, name, arguments in answer.tool_calls
        )
        return output

    def _cached(self, body: dict[str, Any], units: list[tuple[str, int]]) -> int:
        """Input tokens served from the cache, and this prompt remembered for the requests after it."""
        key = str(body.get("prompt_cache_key") or "")
        with self._lock:
            earlier = self._prefixes.setdefault(key, [])
            shared = max((_common_tokens(units, other) for other in earlier), default=0)
            earlier.append(units)
        if sum(tokens for _, tokens in units) < CACHE_MIN_TOKENS or shared < CACHE_MIN_TOKENS:
            return 0
        return shared - shared % CACHE_STEP_TOKENS

    def _response(self, body: dict[str, Any], output: list[dict[str, Any]], usage: dict[str, Any]) -> dict[str, Any]:
        reasoning: dict[str, Any] = body["reasoning"] if isinstance(body.get("reasoning"), dict) else {}
        return {
            "id": f"resp_replay_{next(self._ids):06d}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": str(body.get("model")),
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "prompt_cache_key": body.get("prompt_cache_key"),
            "reasoning": {"effort": reasoning.get("effort", "medium"), "summary": reasoning.get("summary")},
            "store": False,
            "temperature": body.get("temperature", 1.0),
            "text": {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p", 1.0),
            "truncation": "disabled",
            "usage": usage,
            "metadata": {},
        }


def _reasoning_before(items: list[dict[str, Any]], index: int) -> set[str]:
    """Ids of the reasoning items in the run of output items (reasoning, assistant text, function calls) that
    holds item ``index``: the answer it belongs to."""
    found: set[str] = set()
    at = index - 1
    while at >= 0:
        item = items[at]
        kind = _item_type(item)
        if kind == "reasoning":
            found.add(str(item.get("id")))
        elif not (kind == "function_call" or (kind == "message" and item.get("role") == "assistant")):
            break
        at -= 1
    return found


def prompt_units(body: dict[str, Any]) -> list[tuple[str, int]]:
    """The prompt as the cache sees it, in order: the tools, the instructions, each input item (a digest of
    each, with its estimated tokens)."""
    parts: list[Any] = [body.get("tools") or [], body.get("instructions") or "", *input_items(body)]
    units: list[tuple[str, int]] = []
    for part in parts:
        text = json.dumps(part, sort_keys=True, ensure_ascii=False)
        tokens = estimate_tokens(_text(part.get("content")) if isinstance(part, dict) and "content" in part else text)
        units.append((hashlib.sha256(text.encode()).hexdigest(), tokens + (4 if isinstance(part, dict) else 0)))
    return units


def _common_tokens(units: list[tuple[str, int]], other: list[tuple[str, int]]) -> int:
    shared = 0
    for (digest, tokens), (other_digest, _) in zip(units, other, strict=False):
        if digest != other_digest:
            break
        shared += tokens
    return shared
