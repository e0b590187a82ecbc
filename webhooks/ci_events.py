"""Failed CI runs on a branch (SPEC §14): GitHub ``check_suite`` / ``workflow_run`` completed with a failure,
GitLab ``Pipeline Hook`` failed. Whether the branch is a Tasuki branch the intake decides (Redis knows).

Classified before the "sent by the bot" rule: the bot's own push is what a failed run usually follows,
and the fix tasks it starts are bounded by ``followups.max_ci_fixes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from webhooks.payload import get, number, text

FAILED_CONCLUSIONS = ("failure", "timed_out")


@dataclass(frozen=True)
class CIFailure:
    """A CI run failed on ``branch`` of ``source/owner/repo``; ``ci`` says where the forge keeps its jobs."""

    source: str
    owner: str
    repo: str
    branch: str
    ci: dict[str, Any] = field(default_factory=dict)
    actor: str = ""  # who pushed the commit the run ran on (whose permission the fix task rests on)
    actor_id: int | None = None  # GitLab's user id of the actor (its members API names people by number)


def github_ci(event: str, payload: dict[str, Any]) -> CIFailure | str | None:
    """A failed ``check_suite``/``workflow_run``; a reason string when it is one of them but no failure;
    None for other events."""
    if event not in ("check_suite", "workflow_run"):
        return None
    run = get(payload, event)
    if get(payload, "action") != "completed" or get(run, "conclusion") not in FAILED_CONCLUSIONS:
        return f"{event} not a completed failure"
    owner = text(get(payload, "repository", "owner", "login"))
    repo = text(get(payload, "repository", "name"))
    branch = text(get(run, "head_branch"))
    run_id = number(get(run, "id"))
    if not owner or not repo or not branch or run_id is None:
        return f"{event} without repository, branch or id"
    ci = {"run_id": run_id} if event == "workflow_run" else {"check_suite_id": run_id}
    actor = (text(get(run, "triggering_actor", "login")) or text(get(run, "actor", "login"))
             or text(get(payload, "sender", "login")))
    return CIFailure("github", owner, repo, branch, {**ci, "event": event, "sha": text(get(run, "head_sha"))}, actor)


def gitlab_ci(payload: dict[str, Any]) -> CIFailure | str | None:
    """A failed pipeline (``object_kind: pipeline``) on a merge request's source branch, or on a branch."""
    if get(payload, "object_kind") != "pipeline":
        return None
    attributes = get(payload, "object_attributes")
    if get(attributes, "status") != "failed":
        return "pipeline not failed"
    path = text(get(payload, "project", "path_with_namespace"))
    branch = text(get(payload, "merge_request", "source_branch")) or text(get(attributes, "ref"))
    pipeline = number(get(attributes, "id"))
    if "/" not in path or not branch or pipeline is None:
        return "pipeline without project, branch or id"
    owner, repo = path.rsplit("/", 1)
    return CIFailure("gitlab", owner, repo, branch, {"pipeline_id": pipeline, "event": "pipeline",
                                                     "sha": text(get(attributes, "sha"))},
                     text(get(payload, "user", "username")), number(get(payload, "user", "id")))
