"""Request bodies: read with a size limit (never trusting ``Content-Length`` alone), parsed as a JSON object."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import Request

from contexts.errors import TasukiError


class BodyTooLarge(TasukiError):
    """The request body passed ``webhook.max_body_bytes``."""


class Unparsable(TasukiError):
    """The body is not a JSON object."""


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refusing more than ``limit`` bytes whatever ``Content-Length`` claims."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"Content-Length {declared} over {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"body over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_payload(body: bytes, content_type: str) -> dict[str, Any]:
    """The JSON object of a delivery (GitHub may send it form-encoded as ``payload=``)."""
    try:
        if content_type.split(";", maxsplit=1)[0].strip().lower() == "application/x-www-form-urlencoded":
            fields = parse_qs(body.decode("utf-8"), strict_parsing=False)
            text: str | bytes = fields.get("payload", [""])[0]
        else:
            text = body
        payload = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise Unparsable("not JSON") from None
    if not isinstance(payload, dict):
        raise Unparsable("not a JSON object")
    return payload
