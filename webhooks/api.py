"""The small task API (SPEC §8): submit, look up and cancel tasks.

The bearer is a person's API token (issue 40, docs/api-tokens.md): the request acts as the token's owner, with the
token's role — reading needs viewer, submitting and cancelling operator. A body's ``user`` is never believed: the
task's user is the token's owner. The legacy shared ``TASUKI_API_TOKEN`` works only with ``auth.break_glass``.
"""

from __future__ import annotations

import json
import math
import uuid as uuid_module
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from contexts import ContextCompletedError, ContextNotFoundError, InvalidUUIDError, validate_uuid
from contexts.atomic import read_json
from contexts.clock import utc_now
from contexts.names import METADATA_FILE, STATE_FILE
from contexts.repositories import NotARepositoryError, OutsideRootsError, local_repository
from webhooks.api_auth import ApiAuth
from webhooks.api_budgets import budget_routes
from webhooks.body import BodyTooLarge, read_body
from webhooks.intake import Blocking, Intake
from worker.api_tokens import BREAK_GLASS, Caller
from worker.attempt_tasks import describe_group
from worker.attempts import MAX_ATTEMPTS
from worker.profiles import PROFILE_KEY, UnknownProfile, check_profile
from worker.roles import Role
from worker.settings_models import Settings
from worker.spend import resets_at
from worker.submit import Enqueued

_REPO = r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+$"
MAX_PROMPT_CHARS = 100_000


class Submission(BaseModel):
    """``POST /api/tasks``: a forge repository (with an issue or a prompt) or a local repository path."""

    model_config = ConfigDict(extra="forbid")

    repo: Annotated[str, Field(pattern=_REPO, max_length=300)] | None = None
    repo_path: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    source: Literal["github", "gitlab", "gitea"] = "github"
    issue: Annotated[int, Field(gt=0)] | None = None
    prompt: Annotated[str, Field(max_length=MAX_PROMPT_CHARS)] = ""
    user: Annotated[str, Field(max_length=200)] | None = None
    """Ignored for a personal token (the task's user is the token's owner); the break-glass token's word only."""
    model: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    """The model profile (``llm.models``) to run with; None: the repository's, else the default."""
    attempts: Annotated[int, Field(ge=1, le=MAX_ATTEMPTS)] | None = None
    """Agents on separate branches, the best one delivered (docs/attempts.md); None: the attempts settings decide."""

    @model_validator(mode="after")
    def _one_target(self) -> Submission:
        if (self.repo is None) == (self.repo_path is None):
            raise ValueError("give exactly one of repo (OWNER/NAME) and repo_path")
        if self.repo_path is not None and "\x00" in self.repo_path:  # no path holds one (the OS refuses it)
            raise ValueError("repo_path must not contain a NUL byte")
        if self.repo_path is not None and not PurePosixPath(self.repo_path).is_absolute():
            raise ValueError("repo_path must be an absolute path")
        if self.issue is None and not self.prompt.strip():
            raise ValueError("give an issue or a prompt")
        if self.repo_path is not None and self.issue is not None:
            raise ValueError("an issue needs repo, not repo_path")
        return self

    def request(self, uuid: str, caller: Caller | None = None) -> dict[str, Any]:
        """The ``tasuki.run_task`` request; a prompt-only task gets a task key of its own. A personal token's
        ``caller`` is the task's user (and team); the break-glass token (or none, in-process) leaves the body's."""
        if caller is not None and caller is not BREAK_GLASS:
            return {**self.model_copy(update={"user": caller.user}).request(uuid), "team": caller.team}
        chosen: dict[str, Any] = {"config": {PROFILE_KEY: self.model}} if self.model else {}
        if self.attempts is not None:
            chosen["attempts"] = self.attempts
        if self.repo_path is not None:
            name = PurePosixPath(self.repo_path).name or "repo"
            key = {"task_source": "local", "owner": "local", "repo": name, "task_type": "prompt", "task_id": uuid[:8]}
            return {"task_key": key, "repo_path": self.repo_path, "prompt": self.prompt, "user": self.user,
                    "trigger": {"kind": "api"}, **chosen}
        owner, name = str(self.repo).rsplit("/", 1)
        task_type, task_id = ("issue", str(self.issue)) if self.issue else ("prompt", uuid[:8])
        key = {"task_source": self.source, "owner": owner, "repo": name, "task_type": task_type, "task_id": task_id}
        issue = {"number": self.issue} if self.issue else None
        return {"task_key": key, "issue": issue, "prompt": self.prompt, "user": self.user, "trigger": {"kind": "api"},
                **chosen}


def _error(status_code: int, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status_code, headers=headers)


def local_path_checked(settings: Settings, repo_path: str) -> str | JSONResponse:
    """The real path of a local repository (a work tree or a bare one) under ``api.allowed_repo_roots``, or the
    refusal: a token holder never makes a worker clone an arbitrary directory of its host."""
    try:
        return str(local_repository(repo_path, settings.api.allowed_repo_roots))
    except OutsideRootsError:
        roots = ", ".join(str(root.resolve()) for root in settings.api.allowed_repo_roots)
        allowed = roots or "none: api.allowed_repo_roots is empty"
        return _error(403, f"repo_path is not under an allowed root ({allowed})")
    except NotARepositoryError:
        problem = f"{repo_path} is not a git repository (neither a work tree nor a bare one)"
        return _error(422, [{"loc": ["repo_path"], "msg": problem}])


def _submitted(enqueued: Enqueued | str) -> JSONResponse:
    """The answer to a submission: queued (202), already active (200), or over a daily budget (429, with when it
    resets: the caller hears it now, where a webhook's issue gets a comment)."""
    if isinstance(enqueued, str):
        now = utc_now()
        retry_after = math.ceil((resets_at(now) - now).total_seconds())
        return JSONResponse({"status": "over_budget", "reason": enqueued}, status_code=429,
                            headers={"Retry-After": str(retry_after)})
    if enqueued.already_active:
        return JSONResponse({"status": "active", "task_id": enqueued.uuid}, status_code=200)
    return JSONResponse({"task_id": enqueued.uuid}, status_code=202)


def task_api(settings: Settings, intake: Intake, blocking: Blocking) -> APIRouter:
    """The ``/api`` routes, each guarded by a personal token of a role high enough (the legacy token only with
    ``auth.break_glass``); ``blocking`` runs Redis and disk work."""
    router = APIRouter(prefix="/api")
    auth = ApiAuth(settings, blocking)
    router.include_router(budget_routes(settings, intake.client, blocking, auth))  # GET /api/budget(s)

    @router.post("/tasks")
    async def submit(request: Request) -> Response:
        caller = await auth.allowed(request, Role.OPERATOR)
        if isinstance(caller, JSONResponse):
            return caller
        try:
            submission = Submission.model_validate_json(await read_body(request, settings.webhook.max_body_bytes))
        except BodyTooLarge:
            return _error(413, f"body over {settings.webhook.max_body_bytes} bytes")
        except ValidationError as exc:
            problems = [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors(include_url=False)]
            return _error(422, problems)
        if submission.model is not None:
            try:
                check_profile(settings, submission.model)
            except UnknownProfile as exc:
                return _error(422, [{"loc": ["model"], "msg": str(exc)}])
        if submission.repo_path is not None:
            resolved = await blocking(local_path_checked, settings, submission.repo_path)
            if isinstance(resolved, JSONResponse):
                return resolved
            submission = submission.model_copy(update={"repo_path": resolved})  # its identity: the real path
        uuid = str(uuid_module.uuid4())
        task = submission.request(uuid, caller)
        enqueued = await blocking(intake.submit_within_budget, task, uuid)
        await auth.submitted(caller, submission.user, task, enqueued)
        return _submitted(enqueued)

    async def caller_and_uuid(request: Request, uuid: str, needed: Role) -> JSONResponse | tuple[Caller, str]:
        """The refusal (bad token, too low a role, malformed UUID) to answer, or the caller and canonical UUID."""
        caller = await auth.allowed(request, needed)
        if isinstance(caller, JSONResponse):
            return caller
        try:
            return caller, validate_uuid(uuid)
        except InvalidUUIDError as exc:
            return _error(400, str(exc))

    @router.get("/tasks/{uuid}")
    async def show(uuid: str, request: Request) -> Response:
        checked = await caller_and_uuid(request, uuid, Role.VIEWER)
        if isinstance(checked, JSONResponse):
            return checked
        return await blocking(_describe, intake, checked[1])

    @router.post("/tasks/{uuid}/cancel")
    async def cancel(uuid: str, request: Request) -> Response:
        checked = await caller_and_uuid(request, uuid, Role.OPERATOR)
        if isinstance(checked, JSONResponse):
            return checked
        caller, uuid = checked
        try:
            detail = await blocking(intake.cancel, uuid)
        except ContextCompletedError:
            return _error(409, f"task {uuid} is already finished")
        except ContextNotFoundError:
            return _error(404, f"no task {uuid}")
        await auth.audit(caller, "task.cancel", uuid)
        return JSONResponse({"task_id": uuid, "status": "cancel requested", "detail": detail}, status_code=202)

    return router


def _describe(intake: Intake, uuid: str) -> Response:
    """Metadata and state of the task's context; ``queued`` while only Redis knows it."""
    for _ in range(3):  # a context moves from running/ to completed/ between locate and read at most once
        try:
            directory = intake.store.locate(uuid)
            metadata, state = read_json(directory / METADATA_FILE), read_json(directory / STATE_FILE)
        except ContextNotFoundError:
            if (attempts := describe_group(intake.client, uuid)) is not None:  # it runs as several attempts
                return JSONResponse({"task_id": uuid, **attempts})
            task_key = intake.queued_task_key(uuid)
            if task_key is None:
                return _error(404, f"no task {uuid}")
            return JSONResponse({"task_id": uuid, "status": "queued", "task_key": task_key})
        except (OSError, json.JSONDecodeError):
            continue
        return JSONResponse({"task_id": uuid, "status": state.get("status"), "metadata": metadata, "state": state})
    return _error(409, f"task {uuid} is changing place; ask again")
