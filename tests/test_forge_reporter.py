"""A task's life on its issue, for both forges: labels, one progress comment edited in place, PR/MR, summary."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import fakeredis
import pytest

import worker.tasks  # noqa: F401 - loads the subscribers before any test swaps them out
from contexts import ContextStore
from contexts.clock import utc_now
from contexts.state import read_state
from contexts.usage import Usage, add_usage
from scheduler.jobs import monitor_for
from scheduler.monitor import Monitor
from scheduler.plan import Policy
from tests.helpers.fake_forge import FakeForge
from tests.helpers.stack import make_buggy_repo
from worker import endings
from worker.checkout import Checkout
from worker.endings import Ending
from worker.forges import Forge, GiteaForge, GitHubForge, GitLabForge
from worker.forges import reporter as reporter_module
from worker.forges.reporter import MARKER, ForgeReporter, TriggerRefused, progress_body, report_outcome
from worker.run import TaskRequest
from worker.settings import install_settings
from worker.settings_models import LabelSettings, Settings

TOKEN = "glpat-abcdefghijklmnopqrst"
OWNER, REPO = "team", "calc"
UUID = "2f1c0a47-43f1-4c8e-9a4b-0d5f8d5b8f11"
LABELS = LabelSettings()
STATE = {"status": "processing", "llm_call_count": 3, "tool_call_count": 4, "total_tokens_used": 12345, "attempt": 1}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def forge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeForge]:
    root = tmp_path_factory.mktemp("forge")
    with FakeForge(root / "server", TOKEN).serve() as fake:
        fake.add_repo(OWNER, REPO, make_buggy_repo(root / "source"))
        yield fake


_numbers = iter(range(1, 10_000))


@pytest.fixture(params=["github", "gitlab", "gitea"])
def setup(request: pytest.FixtureRequest, forge: FakeForge) -> Iterator[tuple[ForgeReporter, FakeForge, int, Clock]]:
    source = str(request.param)
    number = next(_numbers)
    forge.add_item(OWNER, REPO, number, "add() subtracts", "Fix it.", labels=[LABELS.trigger, LABELS.failed],
                   comments=(("alice", "@tasuki please"), ("tasuki-bot", "<!-- tasuki:old --> earlier run")))
    clients = {"github": lambda: GitHubForge(forge.github_api_url, TOKEN),
               "gitlab": lambda: GitLabForge(forge.gitlab_api_url, TOKEN),
               "gitea": lambda: GiteaForge(forge.gitea_api_url, TOKEN)}
    client: Forge = clients[source]()
    key = {"task_source": source, "owner": OWNER, "repo": REPO, "task_type": "issue", "task_id": str(number)}
    request_ = TaskRequest(task_key=key, user="alice", trigger={"kind": "label", "user": "alice"})
    clock = Clock()
    reporter = ForgeReporter(client, request_, UUID, LABELS, "tasuki-bot", progress_interval_s=10, clock=clock)
    yield reporter, forge, number, clock
    reporter.close()


def test_begin_marks_processing_posts_progress_and_quotes_people_not_the_bot(
    setup: tuple[ForgeReporter, FakeForge, int, Clock],
) -> None:
    reporter, forge, number, _ = setup
    workplace = reporter.begin(STATE)

    item = forge.item(OWNER, REPO, number)
    assert item.labels == [LABELS.processing]  # trigger and the old "failed" are gone
    progress = item.comments[-1]
    assert progress.body.startswith(MARKER.format(uuid=UUID))
    assert "12,345" in progress.body
    assert "3 model calls" in progress.body
    assert UUID in progress.body
    assert workplace.remote == forge.git_url(OWNER, REPO)
    assert workplace.git_env
    assert workplace.git_env["GIT_CONFIG_VALUE_0"].startswith("Authorization: Basic ")
    assert workplace.issue is not None
    assert workplace.issue["title"] == "add() subtracts"
    assert workplace.issue["comments"] == [{"author": "alice", "body": "@tasuki please"}]


def test_progress_is_throttled_and_edits_the_same_comment(setup: tuple[ForgeReporter, FakeForge, int, Clock]) -> None:
    reporter, forge, number, clock = setup
    reporter.begin(STATE)
    comments_after_begin = len(forge.item(OWNER, REPO, number).comments)

    reporter.on_step({**STATE, "llm_call_count": 4})  # within the interval: no API call
    clock.now += 11
    reporter.on_step({**STATE, "llm_call_count": 5})

    comments = forge.item(OWNER, REPO, number).comments
    assert len(comments) == comments_after_begin
    assert "5 model calls" in comments[-1].body
    assert len(comments[-1].history) == 1


def test_completed_task_gets_pr_done_label_final_progress_and_summary(
    setup: tuple[ForgeReporter, FakeForge, int, Clock], tmp_path: Path
) -> None:
    reporter, forge, number, _ = setup
    workplace = reporter.begin(STATE)
    branch = f"tasuki/{number}-{UUID[:8]}-{reporter.forge.source}"
    checkout = Checkout(tmp_path / "w", workplace.remote, branch, git_env=workplace.git_env)
    checkout.prepare()
    (checkout.path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    checkout.commit("fix")
    checkout.push()

    extra = reporter.deliver(branch, "Fix add(): it subtracted.\n\nTests pass.")
    final = {**STATE, "status": "completed"}
    reporter.finish("completed", final, {"summary": "Fix add(): it subtracted.", **extra}, None)

    change = next(c for c in forge.changes if c.head == branch)
    assert extra == {"pull_request_url": change.url}
    assert change.title == f"add() subtracts (#{number})"
    assert f"Closes #{number}" in change.body
    assert UUID in change.body
    item = forge.item(OWNER, REPO, number)
    assert item.labels == [LABELS.done]
    progress = next(c for c in item.comments if MARKER.format(uuid=UUID) in c.body)
    assert "`completed`" in progress.body
    assert change.url in progress.body
    assert item.comments[-1].body.startswith("**Tasuki finished.** " + change.url)


def test_failed_task_without_begin_finds_its_progress_comment_and_gets_the_failed_label(
    setup: tuple[ForgeReporter, FakeForge, int, Clock],
) -> None:
    reporter, forge, number, _ = setup
    reporter.begin(STATE)
    progress_id = forge.item(OWNER, REPO, number).comments[-1].id
    # Another worker gives up on the task: a fresh reporter, no begin.
    fresh = ForgeReporter(reporter.forge, reporter.request, UUID, LABELS, "tasuki-bot")
    fresh.finish("failed", {**STATE, "status": "failed", "error": "gave up after 3 attempts"}, None,
                 "gave up after 3 attempts")

    item = forge.item(OWNER, REPO, number)
    assert item.labels == [LABELS.failed]
    progress = [c for c in item.comments if MARKER.format(uuid=UUID) in c.body]
    assert [c.id for c in progress] == [progress_id]
    assert "gave up after 3 attempts" in progress[0].body
    assert item.comments[-1].body.startswith("**Tasuki stopped: failed.**")


def test_gitlab_note_from_a_non_member_is_refused_before_anything_changes(forge: FakeForge) -> None:
    number = next(_numbers)
    forge.add_item(OWNER, REPO, number, "t", labels=[])
    client = GitLabForge(forge.gitlab_api_url, TOKEN)
    key = {"task_source": "gitlab", "owner": OWNER, "repo": REPO, "task_type": "issue", "task_id": str(number)}
    request = TaskRequest(task_key=key, user="mallory", trigger={"kind": "comment", "user": "mallory", "user_id": 66})
    reporter = ForgeReporter(client, request, UUID, LABELS, "tasuki-bot")
    try:
        with pytest.raises(TriggerRefused):
            reporter.begin(STATE)
        assert forge.item(OWNER, REPO, number).labels == []
    finally:
        reporter.close()


def test_gitea_comment_from_a_reader_is_refused_before_anything_changes(forge: FakeForge) -> None:
    number = next(_numbers)
    forge.add_item(OWNER, REPO, number, "t", labels=[])
    forge.permissions["reader"] = "read"
    key = {"task_source": "gitea", "owner": OWNER, "repo": REPO, "task_type": "issue", "task_id": str(number)}
    request = TaskRequest(task_key=key, user="reader", trigger={"kind": "comment", "user": "reader", "user_id": 67})
    reporter = ForgeReporter(GiteaForge(forge.gitea_api_url, TOKEN), request, UUID, LABELS, "tasuki-bot")
    try:
        with pytest.raises(TriggerRefused):
            reporter.begin(STATE)
        assert forge.item(OWNER, REPO, number).labels == []
        assert reporter.heard({"author": "reader", "user_id": 67, "body": "also this"}) is None  # nor heard later
        forge.permissions["reader"] = "write"
        assert reporter.heard({"author": "reader", "user_id": 67, "body": "also this"}) is not None
    finally:
        reporter.close()


def test_progress_body_masks_errors_and_names_the_way_to_cancel() -> None:
    body = progress_body(UUID, {**STATE, "error": "push to https://u:ghp_abcdefghijklmnopqrstuv@h failed"}, LABELS)
    assert "ghp_" not in body
    assert "/tasuki cancel" in body
    assert LABELS.processing in body


def test_final_progress_shows_the_tasks_tokens_and_cost_or_that_no_prices_are_configured() -> None:
    usage = add_usage(None, Usage("agent", "gpt-4o", 10_000, 500, 4_000), 0.0231, "2026-11-25")
    state = {**STATE, "status": "failed", "usage": usage, "total_tokens_used": usage["tokens"],
             "error": "budget: the task used 10500 tokens, limits.task_tokens is 10000"}
    priced = progress_body(UUID, state, LABELS, priced=True)
    assert "| Tokens | 10,500 (prompt 10,000, of which cached 4,000; completion 500) |" in priced
    assert "| Cost | $0.0231 |" in priced
    assert "limits.task_tokens is 10000" in priced  # the issue is told why, with the figures
    assert "| Cost | no prices configured |" in progress_body(UUID, state, LABELS)


def test_outcome_of_a_task_failed_by_the_monitor_reaches_the_issue(
    forge: FakeForge, make_settings: Callable[..., Settings]
) -> None:
    number = next(_numbers)
    forge.add_item(OWNER, REPO, number, "lost task", labels=[LABELS.processing])
    settings = make_settings({"TASUKI__GITLAB__API_URL": forge.gitlab_api_url, "GITLAB_TOKEN": TOKEN})
    key = {"task_source": "gitlab", "owner": OWNER, "repo": REPO, "task_type": "issue", "task_id": str(number)}
    store = ContextStore(settings.contexts.base_dir)
    ctx = store.create(key, {"llm_provider": "openai", "model": "m", "context_length": 1000,
                             "compression_threshold": 0.7}, heartbeat=False)
    directory = ctx.finish("failed", error="worker lost: heartbeat stale since 2026-01-01T00:00:00Z")

    report_outcome(settings, ctx.uuid, directory)

    item = forge.item(OWNER, REPO, number)
    assert item.labels == [LABELS.failed]
    assert "worker lost" in item.comments[-1].body


def lost_task(settings: Settings, key: dict[str, str]) -> str:
    """A context at its last attempt whose holder, on another host, stopped heartbeating ten minutes ago."""
    long_ago = utc_now() - timedelta(minutes=10)
    ghost = ContextStore(settings.contexts.base_dir, hostname="ghost-host", clock=lambda: long_ago)
    ctx = ghost.create(key, {"llm_provider": "openai", "model": "m", "context_length": 1000,
                             "compression_threshold": 0.7}, heartbeat=False,
                       extra_metadata={"request": {"task_key": key, "prompt": "fix it"}})
    ctx.update_state(status="processing", attempt=settings.monitor.max_attempts)
    ctx.detach()
    return ctx.uuid


def monitor_announcing(settings: Settings, client: fakeredis.FakeRedis) -> Monitor:
    """The beat's monitor as monitor_for builds it (every ending announced), on a fake Redis."""
    store = ContextStore(settings.contexts.base_dir, stale_after_s=settings.contexts.stale_after_s)
    policy = Policy(stale_after_s=settings.contexts.stale_after_s, max_attempts=settings.monitor.max_attempts,
                    resume=True, hostname=store.hostname)
    return Monitor(store, client, policy, send=lambda *_: None, ended=monitor_for(settings).ended)


def test_a_task_the_monitor_fails_is_reported_on_its_issue_after_its_end_is_on_disk(
    forge: FakeForge, make_settings: Callable[..., Settings], fake_redis: fakeredis.FakeRedis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    number = next(_numbers)
    forge.add_item(OWNER, REPO, number, "lost for good", labels=[LABELS.processing])
    settings = make_settings({"TASUKI__GITLAB__API_URL": forge.gitlab_api_url, "GITLAB_TOKEN": TOKEN})
    install_settings(settings)
    key = {"task_source": "gitlab", "owner": OWNER, "repo": REPO, "task_type": "issue", "task_id": str(number)}
    uuid = lost_task(settings, key)
    heard: list[tuple[str, bool]] = []

    def forge_subscriber(ending: Ending) -> None:  # the real one, watched
        directory = ContextStore(settings.contexts.base_dir).completed_path(ending.uuid)
        heard.append((ending.by, read_state(directory)["status"] == "failed"))
        reporter_module._tell_the_forge(ending)

    monkeypatch.setattr(endings, "SUBSCRIBERS", {"forge": forge_subscriber})  # no Redis bookkeeping, no memory
    [outcome] = [o for o in monitor_announcing(settings, fake_redis).run(utc_now()) if o.action.uuid == uuid]

    assert (outcome.action.kind, outcome.done) == ("fail", True)
    assert heard == [("monitor", True)]  # announced once its end was on disk
    item = forge.item(OWNER, REPO, number)
    assert item.labels == [LABELS.failed]
    assert "worker lost" in item.comments[-1].body


def test_a_failing_subscriber_stops_neither_the_others_nor_the_monitor(
    make_settings: Callable[..., Settings], fake_redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings()
    install_settings(settings)
    key = {"task_source": "local", "owner": "o", "repo": "r", "task_type": "prompt", "task_id": "1"}
    uuids = [lost_task(settings, {**key, "task_id": str(n)}) for n in range(2)]
    heard: list[str] = []

    def unreachable(ending: Ending) -> None:
        raise ConnectionError("forge down")

    monkeypatch.setattr(endings, "SUBSCRIBERS", {"forge": unreachable, "memory": lambda e: heard.append(e.uuid)})
    outcomes = monitor_announcing(settings, fake_redis).run(utc_now())

    assert sorted(o.action.uuid for o in outcomes if o.done and o.action.kind == "fail") == sorted(uuids)
    assert sorted(heard) == sorted(uuids)


def test_every_module_that_acts_on_an_ending_subscribes_to_it(make_settings: Callable[..., Settings]) -> None:
    monitor_for(make_settings())  # what the beat's monitor and `tasuki reap` load

    assert {"bookkeeping", "memory", "forge"} <= set(endings.SUBSCRIBERS)


def test_a_worker_s_ending_is_not_reported_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    told: list[str] = []
    monkeypatch.setattr(reporter_module, "report_outcome", lambda *args: told.append(args[1]))
    key = {"task_source": "github", "owner": OWNER, "repo": REPO, "task_type": "issue", "task_id": "1"}

    reporter_module._tell_the_forge(Ending(UUID, key, "completed", by="worker", reported=True))

    assert told == []
