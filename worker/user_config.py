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

from agent.settings import LEGACY_SECTIONS, LLMSettings
from worker.names import USER_CONFIG_PREFIX
from worker.runtime import llm_config
from worker.settings import recursive_merge
from worker.settings_models import CompressionSettings, Settings

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
    settings: Settings, client: redis.Redis | None, user: str | None, fetch: Fetch = fetch_json,
    profile: str | None = None,
) -> dict[str, Any]:
    """The LLM config recorded in ``metadata.json.config`` for a task of ``user`` with the model profile
    ``profile`` (None: the default one, which the user's settings may name); never a secret. An unknown
    ``profile`` raises KeyError (the caller checked it)."""
    url = settings.user_config_api.url
    if not url or not user:
        return llm_config(settings, profile)
    key = USER_CONFIG_PREFIX + user + (f":{profile}" if profile else "")
    cached = _cache_get(client, key)
    if cached is not None:
        return cached
    try:
        answer = fetch(f"{url.rstrip('/')}/config/{quote(user, safe='')}")
        resolved = {**llm_config(apply_overrides(settings, answer, profile), profile), "user_config": "api"}
    except (httpx.HTTPError, ValueError, ValidationError, TypeError, KeyError) as exc:
        log.warning("user config unavailable; using the defaults", user=user, error=str(exc)[:300])
        return llm_config(settings, profile)
    _cache_set(client, key, resolved)
    return resolved


def apply_overrides(settings: Settings, answer: Any, profile: str | None = None) -> Settings:
    """``settings`` with the LLM and compression values of a user-config answer (validated like config.yaml).
    The flat keys (``llm_provider``, ``model``, ``context_length``, ``endpoint``) change the task's profile:
    ``profile``, else the default one; which environment variable holds a profile's key is never the user's to
    say."""
    data = answer.get("data", answer) if isinstance(answer, dict) else None
    if not isinstance(data, dict):
        raise ValueError("the user config answer is not a JSON object")
    llm = _known(data.get("llm"), LLMSettings)
    compression = _known(data.get("compression"), CompressionSettings)
    models = {name: {k: v for k, v in p.items() if k != "api_key_env"} for name, p in
              (llm.get("models") or {}).items() if isinstance(p, dict)}
    if models:
        llm["models"] = models
    else:
        llm.pop("models", None)
    target = profile or llm.get("default") or settings.llm.default
    if target is not None and (target in settings.llm.models or target in models):
        llm["models"] = {**models, str(target): _flat_into_profile(dict(models.get(str(target)) or {}), data)}
    else:
        _flat_into_built_in(settings, llm, data)
    if data.get("compression_threshold") is not None:
        compression["threshold"] = data["compression_threshold"]
    merged_llm = LLMSettings.model_validate(recursive_merge(settings.llm.model_dump(), llm))
    merged_compression = CompressionSettings.model_validate(
        recursive_merge(settings.compression.model_dump(), compression)
    )
    return settings.model_copy(update={"llm": merged_llm, "compression": merged_compression})


def _flat_into_profile(section: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """A named profile's overrides with the flat keys of an answer."""
    for flat, target in (("llm_provider", "provider"), ("model", "model"), ("context_length", "context_length"),
                         ("endpoint", "base_url")):
        if data.get(flat) is not None:
            section[target] = data[flat]
    return section


def _flat_into_built_in(settings: Settings, llm: dict[str, Any], data: dict[str, Any]) -> None:
    """The flat keys of an answer into the built-in profile: ``llm.provider`` and its section."""
    if data.get("llm_provider") is not None:
        llm["provider"] = data["llm_provider"]
    provider = str(llm.get("provider", settings.llm.provider))
    section = dict(llm.get(provider) or {})
    for flat, target in (("model", "model"), ("context_length", "context_length")):
        if data.get(flat) is not None:
            section[target] = data[flat]
    if data.get("endpoint") is not None:
        # an unknown provider keeps OpenAI's key: the validation below refuses it with the key and the value
        section[getattr(LEGACY_SECTIONS.get(provider), "ENDPOINT_KEY", "base_url")] = data["endpoint"]
    if section:
        llm[provider] = section


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
