"""Several attempts per task end to end (issue 39 item 5, docs/attempts.md): real Redis, two real celery worker
processes, the replay model over HTTP (each attempt's conversation routed by the line its first prompt gets), the
fake GitHub over real HTTP and git, and the repository's real check run by the finish gate in each attempt's sandbox.

Attempt 1 fixes the code (its check passes), attempt 2 adds an unrelated module (its check fails): the parent's one
pull request is opened from attempt 1's branch and says so; a pick run again after a crash that lost its record finds
the same pull request; attempt 2's branch is kept, and the sweep deletes it once keep_branches_days have passed."""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from contexts import ContextCompletedError, ContextStore
from replay import ReplayModel, serve
from replay.trajectory import turns_from_entries
from tests.helpers.celery_worker import celery_client
from tests.helpers.fake_forge import FakeChange, FakeForge
from tests.helpers.stack import Stack, git
from tests.helpers.worker_scenarios import provider_env, tool
from tests.test_cli_run import tasuki
from tests.test_finish_gate import FIX, make_checked_repo
from worker.attempt_tasks import GROUP_PREFIX, GROUPS_KEY, PICKING_PREFIX, sweep
from worker.attempts import attempt_note, attempt_uuid
from worker.names import ACTIVE_PREFIX, CANCEL_PREFIX, PICK_ATTEMPTS, TASK_PREFIX, TASKS_QUEUE
from worker.runtime import context_store
from worker.settings import load_settings
from worker.settings_models import LabelSettings
from worker.submit import enqueue, request_cancel, task_key_id

pytestmark = pytest.mark.integration

TOKEN = "attempts-forge-token-5e1a"
OWNER, REPO = "octo", "calc"
KEY = {"task_source": "github", "owner": OWNER, "repo": REPO, "task_type": "issue", "task_id": "1"}
MODULE = tool("write_file", path="mathutil.py", content="def double(x):\n    return 2 * x\n")


def needle(number: int) -> str:
    return attempt_note({"number": number, "of": 2})


ROUTES = {
    needle(1): [{"content": "add() subtracts.", "tool_calls": [FIX]},
                {"content": "Fixed.", "tool_calls": [tool("finish", summary="Fix add(): it subtracted.")]},
                {"content": "The gate agrees.", "tool_calls": [tool("finish", summary="Fix add(): it subtracted.")]}],
    needle(2): [{"content": "A helper will do.", "tool_calls": [MODULE]},
                {"content": "Done.", "tool_calls": [tool("finish", summary="Add mathutil.")]},
                {"content": "Done anyway.", "tool_calls": [tool("finish", summary="Add mathutil.")]}],
}


@contextmanager
def attempts_stack(tmp_path: Path, redis_url: str) -> Iterator[tuple[Stack, FakeForge]]:
    """The replay model routing each attempt; the fake GitHub with the checked calc repository and issue 1, labelled;
    two workers (the attempts run side by side), the finish gate on."""
    routes = {text: turns_from_entries(entries) for text, entries in ROUTES.items()}
    unrouted = turns_from_entries([{"content": "?", "tool_calls": [tool("finish", summary="unrouted")]}])
    server = serve(ReplayModel(unrouted, routes=routes))
    try:
        with FakeForge(tmp_path / "forge", TOKEN).serve() as forge:
            forge.add_repo(OWNER, REPO, make_checked_repo(tmp_path / "source"))
            forge.add_item(OWNER, REPO, 1, "add() is wrong", "add(2, 3) gives -1.", labels=[LabelSettings().trigger])
            stack = Stack(tmp_path, redis_url, server.url, {
                **provider_env("openai", server.url, 32768),
                "TASUKI__GITHUB__API_URL": forge.github_api_url,
                "GITHUB_TOKEN": TOKEN,
                "TASUKI__AGENT__FINISH_GATE": "true",
            })
            try:
                yield stack, forge
            finally:
                stack.stop()
    finally:
        server.stop()


def branches(forge: FakeForge) -> set[str]:
    bare = forge.git_root / OWNER / f"{REPO}.git"
    listed = subprocess.run(["git", "for-each-ref", "--format=%(refname:short)", "refs/heads"], cwd=bare, check=True,
                            capture_output=True, text=True).stdout
    return set(listed.split())


def never(parent: str) -> None:
    raise AssertionError(f"no pick is due for {parent}")


def group(client: redis.Redis, parent: str) -> dict[str, Any]:
    return dict(client.hgetall(GROUP_PREFIX + parent))


def test_the_attempt_whose_checks_pass_is_delivered_once_and_the_others_branch_is_kept_then_swept(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    with attempts_stack(tmp_path, redis_url) as (stack, forge):
        stack.start_worker("w1", concurrency=2)
        stack.start_worker("w2")
        settings = load_settings(env=stack.env())
        request = {"task_key": KEY, "prompt": "", "user": "alice", "trigger": {"kind": "label", "user": "alice"},
                   "attempts": 2}
        with celery_client(redis_url) as app:
            parent = enqueue(app, redis_client, settings, request).uuid
        first, second = attempt_uuid(parent, 1), attempt_uuid(parent, 2)
        stack.wait_until(lambda: group(redis_client, parent).get("finished"), 180, "the attempts' pick")

        # Each attempt ran as a task of its own, on its own branch, and opened nothing itself.
        parent_branch = f"tasuki/1-{parent[:8]}"
        won, lost = f"{parent_branch}-a1", f"{parent_branch}-a2"
        one, two = stack.wait_finished(first), stack.wait_finished(second)
        assert (one["status"], two["status"]) == ("completed", "completed")
        assert one["result"]["attempt_work"]["checks_passed"] is True
        assert two["result"]["attempt_work"]["checks_passed"] is False
        assert {won, lost} <= branches(forge)

        # One pull request, from the passing attempt's branch, saying which attempt won and why.
        assert [c.head for c in forge.changes] == [won]
        change = forge.changes[0]
        assert not change.draft
        assert "Fix add(): it subtracted." in change.body
        assert "attempt 1 of 2: its checks passed (the only one; 1 other attempt(s) did not)" in change.body
        assert f"- attempt 1 (delivered): 2 lines changed, checks pass on `{won}`, task `{first}`" in change.body
        assert f"- attempt 2: 2 lines changed, checks fail on `{lost}`, task `{second}`" in change.body
        assert "Closes #1" in change.body
        assert "All 1 checks pass" in change.body  # the winner's own evidence
        item = forge.item(OWNER, REPO, 1)
        assert LabelSettings().done in item.labels
        finals = [c.body for c in item.comments if c.body.startswith("**Tasuki finished")]
        assert len(finals) == 1
        assert change.url in finals[0]
        assert redis_client.get(ACTIVE_PREFIX + task_key_id(KEY)) is None  # the parent's key is free again

        # A pick that crashed after opening the pull request but before recording it runs again: same request.
        redis_client.hdel(GROUP_PREFIX + parent, "delivered", "delivered_at", "finished")
        with celery_client(redis_url) as app:
            app.send_task(PICK_ATTEMPTS, args=[parent], queue=TASKS_QUEUE)
        stack.wait_until(lambda: group(redis_client, parent).get("finished"), 60, "the pick run again")
        assert [c.head for c in forge.changes] == [won]
        assert json.loads(group(redis_client, parent)["delivered"])["pull_request_url"] == change.url

        # An ending nobody heard and a pick lost with its worker: the sweep sees both attempts' contexts final and
        # sends the pick again, which delivers the pick it recorded (the same branch), never a second request.
        redis_client.hdel(GROUP_PREFIX + parent, "ended.2", "delivered", "finished")
        store = context_store(settings, index=False)
        with celery_client(redis_url) as app:
            def send(uuid: str) -> None:
                app.send_task(PICK_ATTEMPTS, args=[uuid], queue=TASKS_QUEUE)

            assert sweep(settings, redis_client, store, datetime.now(UTC), send)["picks"] == 1
        stack.wait_until(lambda: group(redis_client, parent).get("finished"), 60, "the pick the sweep sent")
        assert [c.head for c in forge.changes] == [won]

        # The loser's branch is kept keep_branches_days, then the sweep deletes it (never the delivered one).
        delivered_at = datetime.fromisoformat(group(redis_client, parent)["delivered_at"])
        days = settings.attempts.keep_branches_days
        assert sweep(settings, redis_client, store, delivered_at + timedelta(days=days) - timedelta(minutes=1),
                     never) == {"picks": 0, "deleted": 0}
        assert lost in branches(forge)
        assert sweep(settings, redis_client, store, delivered_at + timedelta(days=days), never) == \
            {"picks": 0, "deleted": 1}
        assert lost not in branches(forge)
        assert won in branches(forge)
        assert parent not in redis_client.smembers(GROUPS_KEY)


def test_a_local_task_submitted_with_attempts_waits_for_the_pick_and_names_the_winners_branch(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    repo = make_checked_repo(tmp_path / "repo")
    with attempts_stack(tmp_path, redis_url) as (stack, _forge):
        stack.start_worker("w1", concurrency=2)
        done = tasuki(["submit", "--repo-path", str(repo), "--prompt", "Fix add().", "--attempts", "2", "--wait"],
                      stack.env(), tmp_path)
        assert done.returncode == 0, done.stderr
        parent = done.stdout.splitlines()[0].strip()
        won, lost = f"tasuki/{local_task_id('Fix add().')}-{parent[:8]}-a1", f"{lost_prefix(parent)}-a2"
        assert f"branch: {won} in {repo}" in done.stdout
        assert {won, lost} <= local_branches(repo)
        assert local_file(repo, won, "calc.py").endswith("return a + b\n")

        settings = load_settings(env=stack.env())
        delivered_at = datetime.fromisoformat(group(redis_client, parent)["delivered_at"])
        later = delivered_at + timedelta(days=settings.attempts.keep_branches_days)
        assert sweep(settings, redis_client, context_store(settings, index=False), later, never)["deleted"] == 1
        assert lost not in local_branches(repo)
        assert won in local_branches(repo)


def local_task_id(prompt: str) -> str:
    return "p" + hashlib.sha256(prompt.encode()).hexdigest()[:8]


def lost_prefix(parent: str) -> str:
    return f"tasuki/{local_task_id('Fix add().')}-{parent[:8]}"


def local_branches(repo: Path) -> set[str]:
    return set(git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads").split())


def local_file(repo: Path, branch: str, path: str) -> str:
    return git(repo, "show", f"{branch}:{path}")


def test_cancelling_a_task_of_several_attempts_cancels_each_and_a_picked_one_is_finished(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    parent = "5b0c7f3e-1d2a-4e6b-8c9d-0a1b2c3d4e5f"
    store = ContextStore(tmp_path / "contexts")
    redis_client.hset(GROUP_PREFIX + parent, mapping={"of": 2, "request": json.dumps({"task_key": KEY})})
    for number in (1, 2):  # queued, as the fan-out's enqueue records them
        redis_client.set(TASK_PREFIX + attempt_uuid(parent, number), json.dumps(KEY))
    with celery_client(redis_url) as app:
        said = request_cancel(app, redis_client, store, parent)
        assert said == "cancel requested for its 2 attempts; each stops at its next step"
        assert [redis_client.get(CANCEL_PREFIX + attempt_uuid(parent, n)) for n in (1, 2)] == ["1", "1"]
        redis_client.hset(GROUP_PREFIX + parent, "finished", "completed")
        with pytest.raises(ContextCompletedError, match="already finished"):
            request_cancel(app, redis_client, store, parent)


def test_a_worker_killed_mid_pick_after_the_pull_request_opened_leaves_exactly_one(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    with attempts_stack(tmp_path, redis_url) as (stack, forge):
        opened, answer = threading.Event(), threading.Event()

        def hold(change: FakeChange) -> None:  # the request is open on the forge; its answer never reaches the pick
            opened.set()
            answer.wait(60)

        forge.on_open = hold
        first = stack.start_worker("w1", concurrency=2)
        settings = load_settings(env=stack.env())
        request = {"task_key": KEY, "prompt": "", "user": "alice", "trigger": {"kind": "label", "user": "alice"},
                   "attempts": 2}
        with celery_client(redis_url) as app:
            parent = enqueue(app, redis_client, settings, request).uuid
            stack.wait_until(opened.is_set, 180, "the pick to open the pull request")
            first.kill()  # the machine dies while the pick waits for the forge's answer
            forge.on_open = None
            answer.set()
            assert "pick" in group(redis_client, parent)  # recorded before any effect
            assert "delivered" not in group(redis_client, parent)
            assert redis_client.get(ACTIVE_PREFIX + task_key_id(KEY)) == parent  # the issue is still taken

            stack.start_worker("w2")
            redis_client.delete(PICKING_PREFIX + parent)  # the dead run's lock expires (PICK_LOCK_S)
            store = context_store(settings, index=False)
            assert sweep(settings, redis_client, store, datetime.now(UTC),
                         lambda uuid: app.send_task(PICK_ATTEMPTS, args=[uuid], queue=TASKS_QUEUE))["picks"] == 1
            stack.wait_until(lambda: group(redis_client, parent).get("finished"), 60, "the repaired pick")

        assert [c.head for c in forge.changes] == [f"tasuki/1-{parent[:8]}-a1"]
        assert json.loads(group(redis_client, parent)["delivered"])["pull_request_url"] == forge.changes[0].url
        item = forge.item(OWNER, REPO, 1)
        assert LabelSettings().done in item.labels
        assert len([c for c in item.comments if c.body.startswith("**Tasuki finished")]) == 1
        assert redis_client.get(ACTIVE_PREFIX + task_key_id(KEY)) is None
