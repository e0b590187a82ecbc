"""Which model profile a task runs with (issue 37): the first rule that names one wins.

1. the task itself: the task API's ``model``, ``tasuki submit --model``, a trigger label ``coding agent:NAME`` or
   the comment command ``/tasuki model NAME`` (the intake checks the name and answers an unknown one);
2. a follow-up or retry: the profile of the task it follows;
3. ``llm.repositories``: the repository's profile;
4. ``llm.default`` (which the per-user settings service may override), else the built-in profile.

The chosen profile travels in the task request as ``config.profile`` and ends up in ``metadata.json.config``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import structlog

from contexts import TasukiError
from contexts.atomic import read_json
from contexts.names import METADATA_FILE
from contexts.store import ContextStore
from worker.settings_models import Settings

log = structlog.get_logger(__name__)

PROFILE_KEY = "profile"
"""The key of the chosen profile in a task request's ``config`` and in ``metadata.json.config``."""


class UnknownProfile(TasukiError):
    """A task named a model profile the configuration does not have."""


def check_profile(settings: Settings, name: str) -> str:
    """``name`` when it is a profile of the configuration; else :class:`UnknownProfile`, one line naming them."""
    known = settings.llm.profile_names()
    if name not in known:
        raise UnknownProfile(f"no model profile {name!r}: the configured ones are {', '.join(sorted(known))}")
    return name


def repository_profile(settings: Settings, task_key: Mapping[str, Any]) -> str | None:
    """``llm.repositories``'s profile for the task's repository (``source/owner/name`` before ``owner/name``)."""
    owner, repo = task_key.get("owner"), task_key.get("repo")
    for key in (f"{task_key.get('task_source')}/{owner}/{repo}", f"{owner}/{repo}"):
        if key in settings.llm.repositories:
            return settings.llm.repositories[key]
    return None


def choose_profile(
    settings: Settings, named: object, previous: str | None, task_key: Mapping[str, Any]
) -> str | None:
    """The profile of a task: ``named`` (the request's), else ``previous`` (the task it follows), else the
    repository's; None leaves it to ``llm.default``. A name the configuration no longer has (it changed since the
    trigger, or since the previous task) is passed over with a warning."""
    for rule, name in (("request", named), ("previous task", previous)):
        if isinstance(name, str) and name:
            if name in settings.llm.profile_names():
                return name
            log.warning("model profile not configured; the next rule chooses", profile=name, rule=rule)
    return repository_profile(settings, task_key)


def previous_profile(store: Callable[[], ContextStore], uuid: object) -> str | None:
    """The profile the task ``uuid`` ran with: its directory on this host, else the fleet's copy; None when it is
    not found or recorded none."""
    if not isinstance(uuid, str) or not uuid:
        return None
    try:
        contexts = store()
        for directory in (contexts.completed_path(uuid), contexts.running_path(uuid)):
            if directory.is_dir():
                return _profile_of(read_json(directory / METADATA_FILE))
        committed = contexts.durable.committed(uuid)
        return _profile_of(committed.metadata) if committed is not None else None
    except (OSError, ValueError, TasukiError) as exc:
        log.info("the previous task's profile not read", previous=uuid, reason=str(exc)[:200])
        return None


def _profile_of(metadata: Mapping[str, Any]) -> str | None:
    config = metadata.get("config")
    name = config.get(PROFILE_KEY) if isinstance(config, Mapping) else None
    return name if isinstance(name, str) and name else None
