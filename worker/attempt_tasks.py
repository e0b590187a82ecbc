"""Several attempts per task, in the fleet (issue 39 item 5, docs/attempts.md): the fan-out, the pick job, the sweep.

A task asked for N > 1 attempts (its own ``attempts``, a label's, its repository's:
:func:`worker.attempts.attempts_for`) is a *parent*: its delivery runs no agent. It marks the issue (the forge
reporter's ``begin``), records the *group* (a Redis hash under ``tasuki:attempts:<parent>``) and admits N attempts,
each an ordinary task with a key, UUID and branch of its own derived from the parent's, whose reporter opens nothing
(:class:`AttemptReporter`); the parent's task key stays claimed by the parent until its pull request is delivered.
Each attempt's ending is recorded in the group; the ending that completes it sends ``tasuki.pick_attempts(parent)``,
which reads the attempts' results, picks (:func:`worker.attempts.pick`), records the pick, opens the pull request
from the winner's branch through the parent's reporter, finishes the parent on the forge and frees its key.

At most one pull request, even when the pick runs twice (a redelivery after a crash, the sweep's repair, a duplicate
ending): the pick is recorded with ``HSETNX`` before any effect, so every later run delivers the same branch; the
forge's ``open_change`` finds the pull request of a branch before opening one (one per branch); the delivered result
and the finish are recorded, and a run that finds them does nothing again; a lock (``SET NX EX``) keeps two runs from
overlapping. Nothing is lost: a run killed anywhere leaves the group as it was, and the beat's sweep sends the pick
again for every group whose attempts all ended but whose parent is not finished. The sweep also deletes the branches
of the attempts not delivered once ``attempts.keep_branches_days`` have passed since the delivery.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import redis
import structlog

from contexts.atomic import read_json
from contexts.errors import TasukiError
from contexts.masking import mask
from contexts.names import FINAL_STATUSES, METADATA_FILE
from contexts.state import read_state
from contexts.store import ContextStore
from worker import bookkeeping
from worker.attempts import (
    ATTEMPT_SUFFIX,
    MAX_ATTEMPTS,
    Candidate,
    KeptBranch,
    Pick,
    attempt_request,
    attempt_uuid,
    attempts_for,
    due_for_deletion,
    pick,
    pick_body,
    review_prompt,
)
from worker.celery import app
from worker.endings import Ending, on_ending
from worker.followup_tasks import remember_thread
from worker.forges import is_forge, make_forge
from worker.forges.base import Forge
from worker.forges.reporter import ForgeReporter, reporter_for
from worker.names import ATTEMPTS_GROUP_PREFIX, PICK_ATTEMPTS, SWEEP_ATTEMPTS, TASKS_QUEUE
from worker.run import LocalReporter, Reporter, TaskRequest, Workplace, branch_name
from worker.runtime import CLOCK, context_store, llm_config, provider_for, redis_client, settings
from worker.settings_models import Settings
from worker.submit import enqueue

log = structlog.get_logger(__name__)

GROUP_PREFIX = ATTEMPTS_GROUP_PREFIX  # a hash per parent: request, of, branch, ended.<i>, pick, delivered, finished...
GROUPS_KEY = "tasuki:attempt-groups"  # the parents whose branches are not swept yet
PICKING_PREFIX = "tasuki:attempts-picking:"
PICK_LOCK_S = 600
DONE_GROUP_TTL_S = 30 * 24 * 3600  # a swept group is kept a while (the console, a late question), then forgotten
REVIEWER_SYSTEM = "You review several independent attempts at one coding task and name the best one."


class AttemptReporter:
    """The reporter of one attempt: where to clone (the forge's URL and credentials, or the local remote), and
    nothing else — no labels, no progress comment, no pull request: the parent does those once the pick is made.
    ``deliver`` hands back the body the pull request would have had, for the pick job to use."""

    def __init__(self, request: TaskRequest, forge: Forge | None = None) -> None:
        self.request = request
        self.forge = forge

    def begin(self, state: dict[str, Any]) -> Workplace:
        if self.forge is None:
            return Workplace(self.request.remote, None, self.request.issue)
        key = self.request.task_key
        repository = self.forge.repository(key["owner"], key["repo"])
        return Workplace(repository.clone_url, self.forge.git_env(repository.clone_url), self.request.issue)

    def on_step(self, state: dict[str, Any]) -> None:
        """The parent's progress comment is the issue's; an attempt's progress is on its console page."""

    def deliver(self, branch: str, summary: str, *, draft: bool = False) -> dict[str, Any]:
        return {"body": summary}

    def finish(self, status: str, state: dict[str, Any], result: dict[str, Any] | None, error: str | None) -> None:
        """The parent reports, once every attempt ended."""

    def heard(self, entry: dict[str, Any]) -> dict[str, Any] | None:
        return entry

    def close(self) -> None:
        if self.forge is not None:
            self.forge.close()


def attempt_reporter(s: Settings, request: TaskRequest) -> AttemptReporter:
    """An attempt's reporter: with the forge of its parent's key (credentials for its clone), or local."""
    parent_key = dict((request.attempt or {}).get("parent_task_key") or request.task_key)
    source = parent_key.get("task_source")
    forge = make_forge(str(source), s, parent_key, request.trigger) if source and is_forge(str(source)) else None
    return AttemptReporter(request, forge)


# -- the fan-out ---------------------------------------------------------------------------------------------------


def wanted(s: Settings, request: TaskRequest, labels: Sequence[str] = ()) -> int:
    """How many attempts the task gets (1 for an attempt itself, a follow-up, an eval task: those run alone)."""
    if request.attempt or request.followup or request.grading:
        return 1
    a = s.attempts
    return attempts_for(a.default, a.repositories, a.labels, MAX_ATTEMPTS, request.task_key, labels,
                        request.attempts)



def group_key(parent: str) -> str:
    return GROUP_PREFIX + parent


def fan_out(s: Settings, client: redis.Redis, uuid: str, request: dict[str, Any], parsed: TaskRequest, of: int,
            reporter: ForgeReporter | None) -> dict[str, Any]:
    """The parent's delivery: mark the issue, record the group and admit its attempts (each again harmless: the
    group's fields are set once, the attempts' UUIDs are derived and their admission is idempotent)."""
    issue = parsed.issue
    if reporter is not None:
        try:
            issue = reporter.begin({"status": "processing", "attempt": 1}).issue
        except Exception as exc:  # a refused trigger, a forge that does not answer: the parent fails visibly
            error = mask(f"{type(exc).__name__}: {exc}".splitlines()[0])[:500]
            with contextlib.suppress(Exception):
                reporter.finish("failed", {"status": "failed", "error": error}, None, error)
            bookkeeping.release(client, parsed.task_key, uuid, "failed")
            return {"uuid": uuid, "status": "failed", "error": error}
    parent_branch = branch_name(parsed.task_key, uuid)
    key = group_key(uuid)
    pipe = client.pipeline()
    for field, value in (("request", json.dumps(request)), ("of", of), ("branch", parent_branch),
                         ("created", CLOCK().isoformat())):
        pipe.hsetnx(key, field, value)
    pipe.sadd(GROUPS_KEY, uuid)
    pipe.execute()
    group = {_text(k): _text(v) for k, v in client.hgetall(key).items()}
    if group.get("finished"):  # a late redelivery of a parent already delivered: nothing to start again
        return {"uuid": uuid, "status": "fanned_out", "attempts": int(group["of"])}
    of = int(group.get("of") or of)  # a redelivery keeps the first delivery's count
    for number in range(1, of + 1):
        if f"ended.{number}" in group:  # an attempt that ended is not admitted again (its key would stay claimed)
            continue
        child = attempt_request(request, uuid, parent_branch, number, of, issue)
        enqueue(app, client, s, child, uuid=attempt_uuid(uuid, number))
    log.info("task fanned out to attempts", attempts=of, branch=parent_branch)
    return {"uuid": uuid, "status": "fanned_out", "attempts": of}


def run_as_parent(s: Settings, uuid: str, request: dict[str, Any], parsed: TaskRequest,
                  reporter: ForgeReporter | None) -> dict[str, Any] | None:
    """For a task that gets several attempts, its delivery: the fan-out's answer; None for a task that runs alone."""
    of = wanted(s, parsed, (parsed.issue or {}).get("labels") or ())
    if of <= 1:
        return None
    try:
        return fan_out(s, redis_client(), uuid, request, parsed, of, reporter)
    finally:
        if reporter is not None:
            reporter.close()


@on_ending("attempts")
def _attempt_ended(ending: Ending) -> None:
    """An attempt ended: recorded in its group; the ending that completes the group sends the pick."""
    request = ending.request
    if request is None and ATTEMPT_SUFFIX in str(ending.task_key.get("task_id") or ""):
        request = recorded_request(ending.uuid)  # the monitor's endings carry none: the context's metadata has it
    attempt = (request or {}).get("attempt")
    if not isinstance(attempt, dict) or not attempt.get("parent"):
        return
    parent = str(attempt["parent"])
    client = redis_client()
    client.hset(group_key(parent), f"ended.{int(attempt['number'])}", ending.status)
    if all_ended(client.hgetall(group_key(parent))):
        send_pick(parent)


def recorded_request(uuid: str) -> dict[str, Any] | None:
    """The request a finished task's context recorded (None when it is not on this host or unreadable)."""
    try:
        metadata = read_json(context_store(index=False).completed_path(uuid) / METADATA_FILE)
    except (OSError, ValueError, TasukiError):
        return None
    request = metadata.get("request")
    return request if isinstance(request, dict) else None


def describe_group(client: redis.Redis, parent: str) -> dict[str, Any] | None:
    """What the task API says of a parent (it has no context): ``processing`` until the pick finished it, its
    attempts (UUID, ending), and once picked, why and its result; None when ``parent`` ran no attempts."""
    group = {_text(k): _text(v) for k, v in client.hgetall(group_key(parent)).items()}
    if not group.get("request"):
        return None
    of = int(group.get("of") or 0)
    described: dict[str, Any] = {
        "status": group.get("finished") or "processing",
        "task_key": json.loads(group["request"]).get("task_key"),
        "attempts": [{"number": n, "task_id": attempt_uuid(parent, n), "status": group.get(f"ended.{n}")}
                     for n in range(1, of + 1)],
    }
    if group.get("pick"):
        described["pick"] = json.loads(group["pick"]).get("reason")
    if group.get("delivered"):
        described["result"] = json.loads(group["delivered"])
    return described


def all_ended(group: Mapping[Any, Any]) -> bool:
    """Every attempt of the group has a recorded ending."""
    fields = {_text(k): _text(v) for k, v in group.items()}
    of = int(fields.get("of") or 0)
    return of > 0 and all(f"ended.{n}" in fields for n in range(1, of + 1))


def send_pick(parent: str) -> None:
    """Queue the pick (a duplicate is harmless: the pick job is idempotent)."""
    app.send_task(PICK_ATTEMPTS, args=[parent], queue=TASKS_QUEUE)


# -- the pick ------------------------------------------------------------------------------------------------------


@app.task(name=PICK_ATTEMPTS, ignore_result=True)  # type: ignore[untyped-decorator]  # Celery has no hints
def pick_attempts(parent: str) -> dict[str, Any]:
    """Pick the best attempt of ``parent`` and deliver it (idempotent: module docstring)."""
    structlog.contextvars.bind_contextvars(uuid=parent)
    try:
        s = settings()
        return deliver_pick(s, redis_client(), context_store(s, index=False), parent)
    finally:
        structlog.contextvars.unbind_contextvars("uuid")


def deliver_pick(s: Settings, client: redis.Redis, store: ContextStore, parent: str) -> dict[str, Any]:
    """The pick job's work, under the group's lock."""
    key = group_key(parent)
    token = secrets.token_hex(8)
    if not client.set(PICKING_PREFIX + parent, token, nx=True, ex=PICK_LOCK_S):
        return {"uuid": parent, "status": "busy"}  # another run is at it; the sweep repairs if it dies
    try:
        group = {_text(k): _text(v) for k, v in client.hgetall(key).items()}
        if not group.get("request"):
            return {"uuid": parent, "status": "unknown"}
        if group.get("finished"):
            return {"uuid": parent, "status": "done"}
        request = json.loads(group["request"])
        of = int(group["of"])
        states = [attempt_state(store, attempt_uuid(parent, n)) for n in range(1, of + 1)]
        if any(state is None or state.get("status") not in FINAL_STATUSES for state in states):
            return {"uuid": parent, "status": "waiting"}
        candidates = [candidate(n, attempt_uuid(parent, n), state) for n, state in enumerate(states, 1)]
        chosen = recorded_pick(s, client, key, group, candidates, request)
        winner = chosen.winner
        parsed = TaskRequest.from_json(request)
        reporter: Reporter = reporter_for(s, parsed, parent) or LocalReporter(parsed)
        try:
            result = json.loads(group["delivered"]) if group.get("delivered") else None
            if result is None:
                result = delivered_result(reporter, chosen, candidates, states, parsed.task_key, parent)
                client.hset(key, mapping={"delivered": json.dumps(result), "delivered_at": CLOCK().isoformat()})
            status = parent_status(winner, states)
            error = None if status == "completed" else chosen.reason
            state = {"status": status, "attempt": 1, "error": error, "result": result}
            try:
                reporter.finish(status, state, result, error)
            except Exception as exc:
                log.warning("the attempts' ending not reported", error=mask(str(exc))[:300])
        finally:
            close = getattr(reporter, "close", None)
            if close is not None:
                close()
        client.hset(key, "finished", status)
        bookkeeping.release(client, parsed.task_key, parent, status)
        # The parent has no context: whoever waits on it (`tasuki submit --wait`) reads how it ended here.
        bookkeeping.record_stop(client, parent, {"status": status, "error": error, "result": result})
        if winner is not None:
            with contextlib.suppress(redis.RedisError):
                remember_thread(parsed, winner.uuid, {"status": status, **result})
        with contextlib.suppress(Exception):  # `tasuki submit --wait`, Flower: the parent's result under its UUID
            app.backend.store_result(parent, {"uuid": parent, "status": status, **result}, "SUCCESS")
        log.info("attempts picked", winner=winner.attempt if winner else None, reason=chosen.reason)
        return {"uuid": parent, "status": status, **result}
    finally:
        client.eval("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0",
                    1, PICKING_PREFIX + parent, token)


def parent_status(winner: Candidate | None, states: Sequence[dict[str, Any] | None]) -> str:
    """How the parent ends: completed when an attempt was delivered or completed (changing nothing), cancelled when
    every attempt was, else failed."""
    ended = [str((st or {}).get("status")) for st in states]
    if winner is not None or "completed" in ended:
        return "completed"
    return "cancelled" if ended and all(e == "cancelled" for e in ended) else "failed"


def recorded_pick(s: Settings, client: redis.Redis, key: str, group: Mapping[str, str],
                  candidates: Sequence[Candidate], request: Mapping[str, Any]) -> Pick:
    """The group's pick: recorded once (``HSETNX``), before any effect, so every later run delivers the same attempt
    (a reviewer asked twice might answer otherwise)."""
    if "pick" not in group:
        client.hsetnx(key, "pick", json.dumps(pick(candidates, reviewer(s, request)).to_json()))
    recorded = json.loads(_text(client.hget(key, "pick")))
    winner = next((c for c in candidates if c.attempt == recorded.get("winner")), None)
    return Pick(winner, str(recorded.get("reason") or ""))


def delivered_result(reporter: Reporter, chosen: Pick, candidates: Sequence[Candidate],
                     states: Sequence[dict[str, Any] | None], task_key: Mapping[str, str],
                     parent: str) -> dict[str, Any]:
    """Open the pull request from the winner's branch (the forge finds one already opened for it); the parent's
    result: the winner's branch and commit, which attempt won and why."""
    facts = {"attempts": [c.to_json() for c in candidates], "pick": chosen.reason}
    winner = chosen.winner
    if winner is None or winner.branch is None:
        return {"unchanged": True, "summary": chosen.reason, **facts}
    won = (states[winner.attempt - 1] or {}).get("result") or {}
    summary = str(won.get("summary") or "")
    body = pick_body(chosen, candidates, str(won.get("body") or summary))
    result: dict[str, Any] = {"summary": summary, "branch": winner.branch, "commit": won.get("commit"),
                              "attempt": winner.attempt, **facts}
    if won.get("checks"):
        result["checks"] = won["checks"]
    if isinstance(reporter, ForgeReporter):
        reporter.begin({"status": "processing", "attempt": 1})  # the item and base branch the request is opened on
    result.update(reporter.deliver(winner.branch, body, draft=winner.checks_passed is False))
    return result


def attempt_state(store: ContextStore, uuid: str) -> dict[str, Any] | None:
    """An attempt's final state: its context on this host, else the fleet's committed copy; None when not found."""
    path = store.completed_path(uuid)
    if path.is_dir():
        return read_state(path)
    with contextlib.suppress(Exception):
        committed = store.durable.committed(uuid)
        if committed is not None:
            return dict(committed.state)
    return None


def candidate(number: int, uuid: str, state: dict[str, Any] | None) -> Candidate:
    """What the pick weighs of an attempt (an attempt that did not complete with a pushed change delivered nothing)."""
    state = state or {}
    result = state.get("result") or {}
    work = result.get("attempt_work") or {}
    delivered = state.get("status") == "completed" and not result.get("unchanged") and bool(result.get("branch"))
    return Candidate(number, uuid, result.get("branch"), work.get("checks_passed"),
                     int(work.get("changed_lines") or 0), str(work.get("diff") or ""), delivered=delivered)


def reviewer(s: Settings, request: Mapping[str, Any]) -> Any:
    """The reviewer of ``attempts.reviewer`` (None: no review): one stateless request, answered with a number."""
    profile = s.attempts.reviewer
    if profile is None:
        return None
    task = str(request.get("prompt") or "") or json.dumps(request.get("issue") or {})[:4000]

    def review(pool: Sequence[Candidate]) -> str:
        messages = [{"role": "system", "content": REVIEWER_SYSTEM},
                    {"role": "user", "content": review_prompt(pool, task)}]
        return str(provider_for(llm_config(s, profile)).chat(messages, None).content or "")

    return review


# -- the sweep -----------------------------------------------------------------------------------------------------


@app.task(name=SWEEP_ATTEMPTS, ignore_result=True)  # type: ignore[untyped-decorator]  # Celery has no hints
def sweep_attempts() -> dict[str, int]:
    """The beat's pass over the groups: repair picks never sent, delete kept branches whose time is up."""
    s = settings()
    return sweep(s, redis_client(), context_store(s, index=False), CLOCK())


def sweep(s: Settings, client: redis.Redis, store: ContextStore, now: datetime,
          send: Callable[[str], None] = send_pick) -> dict[str, int]:
    """One pass at ``now``: ``{"picks": sent again (through ``send``), "deleted": branches deleted}``."""
    done = {"picks": 0, "deleted": 0}
    for raw in sorted(client.smembers(GROUPS_KEY)):
        parent = _text(raw)
        group = {_text(k): _text(v) for k, v in client.hgetall(group_key(parent)).items()}
        if not group.get("request"):
            client.srem(GROUPS_KEY, parent)
            continue
        if not group.get("finished"):
            of = int(group.get("of") or 0)
            ended = [attempt_state(store, attempt_uuid(parent, n)) for n in range(1, of + 1)]
            if of and all(st is not None and st.get("status") in FINAL_STATUSES for st in ended):
                send(parent)  # its last ending was not heard, or its pick died: sent again
                done["picks"] += 1
            continue
        done["deleted"] += sweep_group(s, client, parent, group, now)
    return done


def sweep_group(s: Settings, client: redis.Redis, parent: str, group: dict[str, str], now: datetime) -> int:
    """Delete the kept branches of a delivered group whose time is up; forget the group once none is left."""
    delivered = json.loads(group.get("delivered") or "{}")
    since = datetime.fromisoformat(group.get("delivered_at") or now.isoformat())
    swept = set(json.loads(group.get("swept") or "[]"))
    kept = [KeptBranch(parent, str(a["branch"]), since) for a in delivered.get("attempts") or []
            if a.get("branch") and a.get("delivered") and a.get("changed_lines")
            and a.get("branch") != delivered.get("branch") and a["branch"] not in swept]
    deleted = 0
    due = due_for_deletion(kept, now, s.attempts.keep_branches_days)
    if due:
        request = TaskRequest.from_json(json.loads(group["request"]))
        for branch in due:
            try:
                delete_branch(s, request, branch.branch)
            except Exception as exc:  # tried again at the next pass
                log.warning("kept branch not deleted", branch=branch.branch, error=mask(str(exc))[:300])
                continue
            swept.add(branch.branch)
            deleted += 1
        client.hset(group_key(parent), "swept", json.dumps(sorted(swept)))
    if all(k.branch in swept for k in kept):  # nothing left to delete: the group is forgotten after a while
        client.srem(GROUPS_KEY, parent)
        client.expire(group_key(parent), DONE_GROUP_TTL_S)
    return deleted


def delete_branch(s: Settings, request: TaskRequest, branch: str) -> None:
    """``git push --delete`` of ``branch`` on the task's remote (the forge's, with its credentials)."""
    source = request.task_key.get("task_source")
    env: dict[str, str] = {}
    if source and is_forge(str(source)):
        forge = make_forge(str(source), s, request.task_key, request.trigger)
        try:
            remote = forge.repository(request.task_key["owner"], request.task_key["repo"]).clone_url
            env = dict(forge.git_env(remote))
        finally:
            forge.close()
    else:
        remote = request.remote
    done = subprocess.run(["git", "push", "--quiet", remote, "--delete", branch], env={"PATH": "/usr/bin:/bin",
                          "GIT_TERMINAL_PROMPT": "0", **env}, capture_output=True, text=True, timeout=120,
                          check=False)
    if done.returncode != 0 and "remote ref does not exist" not in done.stderr:
        raise TasukiError(f"git push --delete {branch}: {done.stderr.strip()[:300]}")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


