"""Per-user LLM settings (SPEC §5, 001 §6.1): ``GET {user_config_api.url}/config/{user}``, cached in Redis.

The answer overrides the defaults; any failure (unreachable, not 200, not JSON, invalid values) means the
defaults. Accepted shapes: the ``llm`` (and ``compression``) sections of config.yaml, or the flat keys of
``metadata.json.config``; both may sit under ``data`` (notfolder's API). Keys that are not LLM settings,
``api_key`` above all, are dropped: credentials come only from the environment.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx
import redis
import structlog
from pydantic import BaseModel, ValidationError

from worker.names import USER_CONFIG_PREFIX
from worker.runtime import llm_config
from worker.settings import recursive_merge
from worker.settings_models import CompressionSettings, LLMSettings, Settings

log = structlog.get_logger(__name__)

CACHE_TTL_S = 300
TIMEOUT_S = 5.0

Fetch = Callable[[str], Any]


def fetch_json(url: str) -> Any:
    """GET ``url`` and decode its JSON (raises on anything else)."""
    response = httpx.get(url, timeout=TIMEOUT_S, follow_redirects=False)
    response.raise_for_status()
    return response.json()


def resolve_llm_config(
    settings: Settings, client: redis.Redis | None, user: str | None, fetch: Fetch = fetch_json
) -> dict[str, Any]:
    """The LLM config recorded in ``metadata.json.config`` for a task of ``user`` (never a secret)."""
    url = settings.user_config_api.url
    if not url or not user:
        return llm_config(settings)
    key = USER_CONFIG_PREFIX + user
    cached = _cache_get(client, key)
    if cached is not None:
        return cached
    try:
        answer = fetch(f"{url.rstrip('/')}/config/{quote(user, safe='')}")
        resolved = {**llm_config(apply_overrides(settings, answer)), "user_config": "api"}
    except (httpx.HTTPError, ValueError, ValidationError, TypeError) as exc:
        log.warning("user config unavailable; using the defaults", user=user, error=str(exc)[:300])
        return llm_config(settings)
    _cache_set(client, key, resolved)
    return resolved


def apply_overrides(settings: Settings, answer: Any) -> Settings:
    """``settings`` with the LLM and compression values of a user-config answer (validated like config.yaml)."""
    data = answer.get("data", answer) if isinstance(answer, dict) else None
    if not isinstance(data, dict):
        raise ValueError("the user config answer is not a JSON object")
    llm = _known(data.get("llm"), LLMSettings)
    compression = _known(data.get("compression"), CompressionSettings)
    if data.get("llm_provider") is not None:
        llm["provider"] = data["llm_provider"]
    provider = str(llm.get("provider", settings.llm.provider))
    section = dict(llm.get(provider) or {})
    for flat, target in (("model", "model"), ("context_length", "context_length")):
        if data.get(flat) is not None:
            section[target] = data[flat]
    if data.get("endpoint") is not None:
        section["host" if provider == "ollama" else "base_url"] = data["endpoint"]
    if section:
        llm[provider] = section
    if data.get("compression_threshold") is not None:
        compression["threshold"] = data["compression_threshold"]
    merged_llm = LLMSettings.model_validate(recursive_merge(settings.llm.model_dump(), llm))
    merged_compression = CompressionSettings.model_validate(
        recursive_merge(settings.compression.model_dump(), compression)
    )
    return settings.model_copy(update={"llm": merged_llm, "compression": merged_compression})


def _known(section: Any, model: type[BaseModel]) -> dict[str, Any]:
    """The keys of ``section`` that ``model`` (and its sub-sections) define; anything else is dropped."""
    if not isinstance(section, dict):
        return {}
    kept: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if name not in section:
            continue
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            kept[name] = _known(section[name], annotation)
        else:
            kept[name] = section[name]
    return kept


def _cache_get(client: redis.Redis | None, key: str) -> dict[str, Any] | None:
    if client is None:
        return None
    try:
        raw = client.get(key)
    except redis.RedisError:
        return None
    if raw is None:
        return None
    try:
        cached = json.loads(raw)
    except ValueError:
        return None
    return cached if isinstance(cached, dict) else None


def _cache_set(client: redis.Redis | None, key: str, value: dict[str, Any]) -> None:
    if client is None:
        return
    try:
        client.set(key, json.dumps(value), ex=CACHE_TTL_S)
    except redis.RedisError as exc:
        log.warning("user config not cached", error=str(exc))
