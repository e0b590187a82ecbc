"""Effects fenced by the lease epoch (SPEC §12 "Fenced at the edges too", issue 27 point 4): in fleet mode a push and a
forge write land only while the holder's epoch is current in PostgreSQL, each push is leased on the checkpoint
recorded under the epoch, and a takeover waits for an effect in flight.

Two "hosts" are two context stores with their own directories, checkouts and hostnames on one real PostgreSQL; the
remote is a real bare git repository behind the fake forge, which speaks GitHub's API over real HTTP."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from agent.fencing import fence_of
from contexts.context import Context
from contexts.errors import FencedError
from contexts.store import ContextStore
from fleet.durable import PostgresCopy, PostgresWriter
from fleet.store import FleetStore
from tests.helpers.ci import cannot_run
from tests.helpers.context_support import CONFIG, wait_for
from tests.helpers.fake_forge import FakeForge
from tests.helpers.fencing_trial import can_set_hostnames, run_trial, trial_stack
from tests.helpers.fleet_hosts import HostFactory, lease_expired, waiting_for_a_lock
from tests.helpers.postgres import PostgresServer
from tests.helpers.stack import git, make_buggy_repo
from worker.checkout import Checkout
from worker.forges import GitHubForge
from worker.forges.reporter import MARKER, ForgeReporter
from worker.run import TaskRequest, branch_name
from worker.settings_models import LabelSettings

TOKEN = "ghp_0123456789abcdefABCDEF0123456789abcd"
OWNER, REPO, ISSUE = "octo-org", "calc", 7
TASK = {"task_source": "github", "owner": OWNER, "repo": REPO, "task_type": "issue", "task_id": str(ISSUE)}


@pytest.fixture
def forge(tmp_path: Path) -> Iterator[FakeForge]:
    with FakeForge(tmp_path / "server", TOKEN).serve() as fake:
        fake.add_repo(OWNER, REPO, make_buggy_repo(tmp_path / "source"))
        fake.add_item(OWNER, REPO, ISSUE, "add() subtracts")
        yield fake


@dataclass
class Holder:
    """One host's holder of the task: its context, its checkout and its reporter, wired as worker/run.py wires them."""

    ctx: Context
    checkout: Checkout
    report: ForgeReporter

    def begin(self) -> None:
        with fence_of(self.ctx).holding():
            self.report.begin(self.ctx.read_state())

    def progress(self) -> None:
        with fence_of(self.ctx).holding():
            self.report.on_step(self.ctx.read_state())

    def deliver(self, summary: str) -> None:
        with fence_of(self.ctx).holding():
            self.report.deliver(self.checkout.branch, summary)

    def work(self, step: int, text: str) -> None:
        """A step that changes calc.py: its records committed, then its checkpoint pushed (in the background)."""
        (self.checkout.path / "calc.py").write_text(f"def add(a, b):\n    return a + b  # {text}\n")
        self.ctx.append_message("assistant", text)
        self.ctx.stage_state(add={"llm_call_count": 1})
        self.ctx.step_done()
        assert self.checkout.checkpoint(step)


def holder_on(store: ContextStore, ctx: Context, forge: FakeForge) -> Holder:
    client = GitHubForge(forge.github_api_url, TOKEN, backoff_s=0.01)
    url = forge.git_url(OWNER, REPO)
    workspace = store.base_dir.parent / "workspaces" / ctx.uuid
    checkout = Checkout(workspace, url, branch_name(TASK, ctx.uuid), git_env=client.git_env(url), fence=fence_of(ctx))
    report = ForgeReporter(
        client, TaskRequest(task_key=TASK), ctx.uuid, LabelSettings(), "tasuki-bot", progress_interval_s=0.0
    )
    return Holder(ctx, checkout, report)


def remote_refs(forge: FakeForge) -> dict[str, str]:
    listed = git(
        forge.git_root / OWNER / f"{REPO}.git", "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads"
    )
    return dict(line.split(" ", 1) for line in listed.splitlines())


def recorded(dsn: str, uuid: str) -> tuple[int, str] | None:
    """The checkpoint the durable copy records for the task: (epoch, commit; "" once the branch was deleted)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT epoch, head FROM tasuki_checkpoints WHERE uuid = %s", (uuid,)).fetchone()
    return None if row is None else (int(row[0]), str(row[1]))


def progress_comments(forge: FakeForge, uuid: str) -> list[str]:
    return [c.body for c in forge.item(OWNER, REPO, ISSUE).comments if MARKER.format(uuid=uuid) in c.body]


def take_over(host: HostFactory, dsn: str, ctx: Context) -> Context:
    """Host b takes the task once host a's lease ran out by the database's clock: epoch 2."""
    wait_for(lambda: lease_expired(dsn, ctx.uuid), timeout=30, what="a's lease to expire by the database")
    taken = host("b").open(ctx.uuid, heartbeat=False)
    assert lease_epoch(dsn, ctx.uuid) == 2
    return taken


def run_out(dsn: str, uuid: str) -> None:
    """The task's lease runs out now by the database's clock (its holder's heartbeat stopped)."""
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE tasuki_leases SET expires_at = now() WHERE uuid = %s", (uuid,))


def lease_epoch(dsn: str, uuid: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT epoch FROM tasuki_leases WHERE uuid = %s", (uuid,)).fetchone()
    assert row is not None
    return int(row[0])


def test_a_holder_taken_over_pushes_and_comments_nothing_and_the_new_holders_effects_land_once(
    host: HostFactory, fleet_dsn: str, forge: FakeForge
) -> None:
    a_store = host("a", lease_s=0.5)
    a = holder_on(a_store, a_store.create(TASK, CONFIG, heartbeat=False), forge)
    uuid = a.ctx.uuid
    a.begin()
    a.checkout.prepare(fresh=True)
    a.checkout.settle()
    a.work(1, "by a")
    a.checkout.settle()
    checkpoint_ref = f"refs/heads/{a.checkout.checkpoint_branch}"
    assert recorded(fleet_dsn, uuid) == (1, remote_refs(forge)[checkpoint_ref])

    b_ctx = take_over(host, fleet_dsn, a.ctx)
    b = holder_on(b_ctx.store, b_ctx, forge)
    b.begin()  # finds a's progress comment by its marker and edits it
    assert b.checkout.prepare(fresh=False, steps=1)
    claimed = remote_refs(forge)[checkpoint_ref]
    assert recorded(fleet_dsn, uuid) == (2, claimed)  # b's claim, recorded under its epoch

    # Host a was paused past the takeover and goes on as if nothing happened: nothing it does reaches the forge.
    before = len(forge.requests)
    comment = progress_comments(forge, uuid)
    (a.checkout.path / "calc.py").write_text("def add(a, b):\n    return a + b  # stale\n")
    assert a.checkout.checkpoint(2)
    with pytest.raises(FencedError):
        a.checkout.pushes.wait()  # tried twice: refused twice, before git ran
    a.checkout.commit("tasuki: stale work")
    with pytest.raises(FencedError):
        a.checkout.push()
    with pytest.raises(FencedError):
        a.progress()
    with pytest.raises(FencedError):
        a.deliver("stale work")
    assert len(forge.requests) == before  # not one request, to the API or to git
    assert progress_comments(forge, uuid) == comment
    assert forge.changes == []
    assert set(remote_refs(forge)) == {"refs/heads/main", checkpoint_ref}
    assert remote_refs(forge)[checkpoint_ref] == claimed
    assert recorded(fleet_dsn, uuid) == (2, claimed)

    b.work(2, "by b")
    b.checkout.settle()
    assert recorded(fleet_dsn, uuid) == (2, remote_refs(forge)[checkpoint_ref])
    b.progress()
    b.checkout.commit("tasuki: the work")
    b.checkout.push()
    b.deliver("the work")

    refs = remote_refs(forge)
    assert refs[f"refs/heads/{b.checkout.branch}"] == b.checkout.head()
    assert checkpoint_ref not in refs  # dropped by the final push
    assert recorded(fleet_dsn, uuid) == (2, "")
    assert "stale" not in forge.branch_file(OWNER, REPO, b.checkout.branch, "calc.py")
    assert "by b" in forge.branch_file(OWNER, REPO, b.checkout.branch, "calc.py")
    assert [c.head for c in forge.changes] == [b.checkout.branch]  # one pull request
    assert len(progress_comments(forge, uuid)) == 1  # one progress comment, edited in place
    # The fenced holder's later tries are refused as well, the task's work done.
    with pytest.raises(FencedError):
        a.checkout.push()
    with pytest.raises(FencedError):
        a.deliver("stale work")
    assert remote_refs(forge) == refs
    assert len(forge.changes) == 1
    b.ctx.detach()
    a.ctx.detach()


def test_a_takeover_waits_for_an_effect_in_flight_which_lands_under_the_epoch_it_began_in(
    host: HostFactory, fleet_dsn: str, forge: FakeForge
) -> None:
    """The lease row held through the effect: the takeover cannot slip between a holder's check and its comment."""
    a_store = host("a", lease_s=30)  # the hold lasts at most lease_s: longer than this test needs
    a = holder_on(a_store, a_store.create(TASK, CONFIG, heartbeat=False), forge)
    run_out(fleet_dsn, a.ctx.uuid)
    taken: list[Context] = []
    with fence_of(a.ctx).holding():
        taker = threading.Thread(target=lambda: taken.append(host("b").open(a.ctx.uuid, heartbeat=False)))
        taker.start()
        wait_for(lambda: waiting_for_a_lock(fleet_dsn), timeout=30, what="the taker to wait for the effect")
        a.report.begin(a.ctx.read_state())  # the effect, while the taker waits: it lands under epoch 1
        assert taken == []
    taker.join(timeout=30)
    assert len(taken) == 1
    assert lease_epoch(fleet_dsn, a.ctx.uuid) == 2
    assert len(progress_comments(forge, a.ctx.uuid)) == 1
    before = len(forge.requests)
    with pytest.raises(FencedError):
        a.progress()
    assert len(forge.requests) == before
    taken[0].detach()
    a.ctx.detach()


def test_a_holder_stopped_inside_an_effect_keeps_a_taker_out_for_its_lease_at_most_and_learns_it_was_fenced(
    host: HostFactory, fleet_dsn: str, forge: FakeForge
) -> None:
    """The server ends a hold idle for ``lease_s`` (a holder stopped in the middle of its effect must not keep the
    task from every other host for ever); the holder, once its effect returns, finds its epoch gone and stops."""
    a_store = host("a", lease_s=1)
    a = holder_on(a_store, a_store.create(TASK, CONFIG, heartbeat=False), forge)
    run_out(fleet_dsn, a.ctx.uuid)
    taken: list[Context] = []
    with pytest.raises(FencedError), fence_of(a.ctx).holding():  # noqa: PT012 - the hold's end is what raises
        taker = threading.Thread(target=lambda: taken.append(host("b").open(a.ctx.uuid, heartbeat=False)))
        taker.start()
        taker.join(timeout=60)  # the taker got the lease while the holder was still "inside" its effect
        assert len(taken) == 1
        assert lease_epoch(fleet_dsn, a.ctx.uuid) == 2
    with pytest.raises(FencedError):
        a.progress()
    taken[0].detach()
    a.ctx.detach()


def test_a_push_waits_for_a_restarting_database_and_lands_once_recorded(
    private_postgres: PostgresServer, tmp_path: Path, forge: FakeForge
) -> None:
    """A holder whose database restarts: its push waits (it must not land without the epoch check) and then goes out
    once, recorded under its epoch; the task goes on."""
    dsn = private_postgres.dsn(private_postgres.create_database())
    with FleetStore(dsn, connect_timeout_s=1, lease_s=120) as fleet:
        store = ContextStore(tmp_path / "a" / "contexts", hostname="host-a", fsync="never", durable=PostgresCopy(fleet))
        a = holder_on(store, store.create(TASK, CONFIG, heartbeat=False), forge)
        a.checkout.prepare(fresh=True)
        a.checkout.settle()
        writer = a.ctx._durable
        assert isinstance(writer, PostgresWriter)
        checkpoint_ref = f"refs/heads/{a.checkout.checkpoint_branch}"
        claimed = remote_refs(forge)[checkpoint_ref]
        private_postgres.stop()
        (a.checkout.path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
        assert a.checkout.checkpoint(1)  # its push, in the background, waits for the database
        wait_for(lambda: writer.retries > 0, timeout=60, what="a push that found the database gone")
        assert remote_refs(forge)[checkpoint_ref] == claimed  # not pushed without the check
        private_postgres.start()
        a.checkout.pushes.wait()
        pushed = remote_refs(forge)[checkpoint_ref]
        assert pushed == a.checkout.lease.latest != claimed
        assert recorded(dsn, a.ctx.uuid) == (1, pushed)
        a.ctx.detach()


# -- real workers: a holder stopped past its lease (SIGSTOP of its whole process tree) -------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("point", ["bash", "finish"])
def test_in_fleet_mode_a_holder_stopped_past_its_lease_reaches_nothing_and_the_task_completes_once(
    tmp_path: Path, redis_url: str, redis_client: object, fleet_dsn: str, point: str
) -> None:
    """tests/helpers/fencing_trial.py's trial with the fleet's store: host b takes epoch 2 once host a's lease ran
    out by the database's clock; a, continued, reaches neither the remote nor the forge nor the context; one pull
    request, and every push of the task recorded under the epoch that made it."""
    if not can_set_hostnames():
        cannot_run("workers cannot be given hostnames of their own here (unshare --uts needs root)")
    # The lease runs out before the monitor's stale time (3 s), so its first re-sent delivery can take the task.
    fleet = {"TASUKI__FLEET__STORE": fleet_dsn, "TASUKI__FLEET__LEASE_S": "2.5"}
    with trial_stack(tmp_path, redis_url, "per-host", point, step=2, steps=4, env=fleet) as trial:
        state = run_trial(trial)
    with psycopg.connect(fleet_dsn) as conn:
        (uuid,) = (str(row[0]) for row in conn.execute("SELECT uuid FROM tasuki_leases"))  # the one task
    assert state["result"]["branch"].endswith(uuid[:8])
    assert lease_epoch(fleet_dsn, uuid) == 2
    assert recorded(fleet_dsn, uuid) == (2, "")  # the final push dropped the checkpoints, under epoch 2
