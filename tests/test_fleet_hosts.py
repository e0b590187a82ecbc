"""The fleet across hosts (SPEC §12, issue 27): three worker hosts and a storage host, each a network namespace
with its own hostname, PID namespace and directories (tests/helpers/netns.py, tests/helpers/fleet_netns.py);
PostgreSQL and Redis on the storage host, the scripted model and the fake forge on a host of their own. Faults with
a task in flight on every host, each landing by event (the model holds turn 2 of every task at a gate), never by
speed. Each fault: every task completes exactly once on the fleet — one pull request, every model answer once in
the durable copy, nothing lost. Run them with ``-n 0``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from replay.trajectory import MARKER_PATTERN
from tests.helpers.celery_worker import REPO_ROOT
from tests.helpers.faketime import require_libfaketime
from tests.helpers.fleet_hosts import lease_expired
from tests.helpers.fleet_netns import OWNER, REPO, TIMINGS, Fleet, logging_turns, tasuki_fleet
from tests.helpers.netns import SUBNET, Host, ip, network
from tests.test_fleet_worker import only_deferrals_traced

pytestmark = [pytest.mark.integration, pytest.mark.fleet_hosts]

STEPS = 5  # bash steps, then finish
GATE_TURN = 2
TASKS = (1, 2, 3)


def namespaces() -> set[str]:
    return {line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()}


def a_failing_test(root: Path, seen: dict[str, Any]) -> None:
    """Two hosts, a process on one, checked from inside; then the test fails."""
    env = {"PATH": os.environ["PATH"]}
    with network(root) as net:
        host, other = net.host("host-x"), net.host("host-y")
        seen["sleeper"] = host.popen(["sleep", "600"], env=env, log=root / "sleep.log", cwd=root)
        shown = host.run(["sh", "-c", 'echo "$(hostname) $$"; ip -br -4 addr show eth0'], env=env, cwd=root)
        name, pid = shown.stdout.splitlines()[0].split()
        assert (name, int(pid) < 10) == ("host-x", True)  # its own UTS and PID namespace
        assert f"{SUBNET}." in shown.stdout.splitlines()[1]
        assert SUBNET not in ip("-br", "addr")  # the root namespace has no link to the hosts
        assert {host.name, other.name, net.switch} <= namespaces()
        seen["prefix"], seen["pids"] = net.prefix, host.pids() + other.pids()
        raise RuntimeError("the test failed")


def test_hosts_have_their_own_hostname_and_pids_and_are_removed_with_their_processes_when_a_test_fails(
    tmp_path: Path,
) -> None:
    seen: dict[str, Any] = {}
    with pytest.raises(RuntimeError, match="the test failed"):
        a_failing_test(tmp_path, seen)
    assert seen["sleeper"].poll() is not None
    assert len(seen["pids"]) >= 3  # two inits and the sleeper
    left = {pid: Path(f"/proc/{pid}/stat").read_text() for pid in seen["pids"] if Path(f"/proc/{pid}").exists()}
    assert not left
    assert not [name for name in namespaces() if name.startswith(seen["prefix"])]


def turns(gate: str) -> list[dict[str, Any]]:
    return logging_turns(STEPS, gate, GATE_TURN)


def in_flight_on_every_host(fleet: Fleet, gate: str) -> dict[str, str] | None:
    """Every host holds a task, and every task waits at the gate with its earlier steps committed and their
    checkpoint on the remote (the push overlaps the next model call: a fault before it lands loses the step's
    checkout, which the next holder tells the model to redo — a scripted model would not)."""
    held = fleet.holders()
    reached = fleet.model.model.gates().get(gate, {}).get("reached", 0)
    names = {host.hostname for host in fleet.hosts}
    if set(held) != names or reached < len(names):
        return None
    pushed = all(fleet.checkpoint(uuid) == f"tasuki: checkpoint after step {GATE_TURN}" for uuid in held.values())
    return held if pushed else None


def a_task_on_every_host(fleet: Fleet, gate: str) -> tuple[list[str], Host, str]:
    """Start the fleet's workers and one task per host; wait until each is held at ``gate`` (see
    :func:`in_flight_on_every_host`). Returns the tasks, the first host and its task."""
    fleet.start_workers()
    uuids = [fleet.send(fleet.issue(number, f"Log every step ({number})")) for number in TASKS]
    held = fleet.wait_until(lambda: in_flight_on_every_host(fleet, gate), "a task in flight on every host")
    return uuids, fleet.hosts[0], held[fleet.hosts[0].hostname]


def ended(fleet: Fleet, uuids: list[str]) -> dict[str, dict[str, Any]] | None:
    """Every task's final state once each is final in the durable copy and its finisher has told the forge (the
    forge is told after the context, then the worker logs "task finished")."""
    states = fleet.states()
    done = {uuid: states[uuid] for uuid in uuids if states.get(uuid, {}).get("status") in ("completed", "failed")}
    if len(done) < len(uuids):
        return None
    logs = [log.read_text(errors="replace") for log in fleet.logs if log.name.endswith("-tasks.log")]
    finished = [line for text in logs for line in text.splitlines() if '"event": "task finished"' in line]
    return done if all(any(uuid in line for line in finished) for uuid in uuids) else None


def records(fleet: Fleet, uuid: str, file: str) -> list[tuple[int, int, dict[str, Any]]]:
    """The durable copy's lines of one file of a context: (id, epoch, record)."""
    rows = fleet.query(
        "SELECT id, epoch, line::text FROM tasuki_records WHERE uuid = %s AND file = %s ORDER BY id", uuid, file
    )
    return [(int(id_), int(epoch), json.loads(line)) for id_, epoch, line in rows]


def assert_once_in_the_durable_copy(fleet: Fleet, uuid: str, turn_count: int) -> None:
    """Every model answer exactly once, in order; every tool call answered once; no gap in either file."""
    messages = [record for _id, _epoch, record in records(fleet, uuid, "messages.jsonl")]
    assert [m["seq"] for m in messages] == list(range(1, len(messages) + 1))
    answers = [MARKER_PATTERN.search(m.get("content") or "") for m in messages if m["role"] == "assistant"]
    assert [int(found.group(1)) for found in answers if found] == list(range(turn_count)), messages
    answered = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert len(answered) == len(set(answered)) == turn_count
    tools = [record for _id, _epoch, record in records(fleet, uuid, "tools.jsonl")]
    assert [t["seq"] for t in tools] == list(range(1, turn_count + 1))


def assert_one_pull_request_each(fleet: Fleet, states: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """One pull request per task, on the branch the task recorded, whose head is the task's commit and whose
    ``log.txt`` has every step once; returns each task's log lines."""
    branches = sorted(state["result"]["branch"] for state in states.values())
    assert sorted(change.head for change in fleet.forge.changes) == branches
    bare = fleet.forge.git_root / OWNER / f"{REPO}.git"
    logs = {}
    for uuid, state in states.items():
        branch = state["result"]["branch"]
        head = subprocess.run(
            ["git", "rev-parse", f"refs/heads/{branch}"], cwd=bare, capture_output=True, text=True, check=True
        ).stdout.strip()
        assert head == state["result"]["commit"]
        logs[uuid] = fleet.forge.branch_file(OWNER, REPO, branch, "log.txt").splitlines()
        assert [line.split(" host=")[0] for line in logs[uuid]] == [f"step {n}" for n in range(STEPS)]
    return logs


def test_a_host_killed_mid_task_its_task_completes_once_on_another_host(tmp_path: Path) -> None:
    gate = "host-killed"
    entries = turns(gate)
    with tasuki_fleet(tmp_path, entries) as fleet:
        uuids, dead, victim = a_task_on_every_host(fleet, gate)
        dead.kill()  # every process of host-1, at once
        assert dead.pids() == []
        fleet.model.model.open_gate(gate)
        states = fleet.wait_until(lambda: ended(fleet, uuids), "every task to end")
        assert_taken_over_once(fleet, uuids, states, victim, dead)


def assert_taken_over_once(
    fleet: Fleet, uuids: list[str], states: dict[str, dict[str, Any]], victim: str, dead: Host
) -> None:
    """Every task completed once (one pull request each, every answer once in the durable copy), ``victim`` by another
    host than ``dead`` in a second attempt that kept the dead host's committed steps."""
    assert {uuid: s["status"] for uuid, s in states.items()} == dict.fromkeys(uuids, "completed")
    assert {uuid: s["attempt"] for uuid, s in states.items()} == {u: 2 if u == victim else 1 for u in uuids}
    for uuid in uuids:
        assert_once_in_the_durable_copy(fleet, uuid, STEPS + 1)
    logs = assert_one_pull_request_each(fleet, states)
    assert released(fleet) == {u: 2 if u == victim else 1 for u in uuids}  # the victim's taken twice
    finisher = str(states[victim]["worker"]).split(":", 1)[0]
    assert finisher in {host.hostname for host in fleet.hosts} - {dead.hostname}
    before, after = logs[victim][:GATE_TURN], logs[victim][GATE_TURN:]
    assert {line.split(" host=")[1] for line in before} == {dead.hostname}  # its steps before the kill kept
    assert {line.split(" host=")[1] for line in after} == {finisher}
    epochs = {epoch for _id, epoch, _record in records(fleet, victim, "messages.jsonl")}
    assert epochs == {1, 2}  # the dead host's committed steps kept, the rest written by the new holder


def released(fleet: Fleet) -> dict[str, int]:
    """The epoch of every released lease, by task (a live lease is left out)."""
    return dict(fleet.query("SELECT uuid::text, epoch FROM tasuki_leases WHERE holder IS NULL"))


def remote_and_forge(fleet: Fleet) -> str:
    """Everything a holder can change outside the durable copy: every ref of the remote, the issues' labels and
    comments (with their edits), the pull requests."""
    bare = fleet.forge.git_root / OWNER / f"{REPO}.git"
    refs = subprocess.run(
        ["git", "for-each-ref", "--format=%(refname) %(objectname)"],
        cwd=bare,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    items = [
        (i.number, sorted(i.labels), [(c.id, c.body, list(c.history)) for c in i.comments])
        for i in fleet.forge.items.values()
    ]
    changes = [(c.number, c.head, c.base, c.title, c.body) for c in fleet.forge.changes]
    return json.dumps([refs, items, changes], sort_keys=True, default=str)


def holders_states(fleet: Fleet) -> dict[str, dict[str, Any]]:
    """Every context's committed state as its holders wrote it: without what a task's memory jobs meter into the
    durable copy after its end, from any host and under no lease (``worker/metering.py``)."""
    metered = ("usage", "total_tokens_used", "updated_at")
    return {uuid: {k: v for k, v in state.items() if k not in metered} for uuid, state in fleet.states().items()}


def cut_off(host: Host) -> Callable[[], None]:
    """Take the host's link down; returns how to heal it."""
    host.cut()
    return host.heal


def paused(host: Host) -> Callable[[], None]:
    """SIGSTOP every process of the host; returns how to continue them."""
    stopped = host.pause()
    return lambda: host.resume(stopped)


@pytest.mark.parametrize("fault", [cut_off, paused], ids=["cut-off", "paused"])
def test_a_host_cut_off_or_paused_past_its_lease_then_back_keeps_running_and_writes_nothing_more(
    tmp_path: Path, fault: Callable[[Host], Callable[[], None]]
) -> None:
    gate = "host-away"
    entries = turns(gate)
    with tasuki_fleet(tmp_path, entries) as fleet:
        uuids, away, victim = a_task_on_every_host(fleet, gate)
        kept = records(fleet, victim, "messages.jsonl")  # what its holder committed before the fault
        back = fault(away)
        fleet.model.model.open_gate(gate)  # the other hosts go on; the answer to the host away cannot be taken
        # Its lease runs out by the database's clock; a monitor resumes the task, a host with a free slot takes it.
        states = fleet.wait_until(lambda: ended(fleet, uuids), "every task to end")
        seen = remote_and_forge(fleet), holders_states(fleet), records(fleet, victim, "messages.jsonl")
        back()
        # The holder gets its answer (or asks again), tries to go on, and learns it was fenced.
        log = fleet.root / f"{away.hostname}-tasks.log"
        fleet.wait_until(lambda: "this delivery stops writing" in log.read_text(), "the holder fenced")
        fleet.wait_until(lambda: f"tasuki.run_task[{victim}] ignored" in log.read_text(), "its delivery to end")
        # A monitor pass on that host finds the fenced holder's directory, a leftover: the fleet finished the task
        # elsewhere. Nothing to resume, no holder to kill.
        # (A task that ended less than stale_after_s ago is listed as skipped; one that ended longer ago — a loaded
        # machine — only leaves the heartbeat index: neither is a resume nor a kill.)
        acted = [line for line in reap_on(fleet, away)
                 if line != "nothing to do" and "  skip" not in line and "  unindex: finished (" not in line]
        assert acted == []
        assert "monitor killed a hung holder" not in (fleet.root / f"{away.hostname}-maint.log").read_text()
        assert all(process.poll() is None for process in away.processes)  # its workers keep running
        assert fleet.answers_ping(f"tasks@{away.hostname}")
        assert (remote_and_forge(fleet), holders_states(fleet), records(fleet, victim, "messages.jsonl")) == seen
        assert {uuid: s["status"] for uuid, s in states.items()} == dict.fromkeys(uuids, "completed")
        assert states[victim]["attempt"] == 2
        for uuid in uuids:
            assert_once_in_the_durable_copy(fleet, uuid, len(entries))
        assert_one_pull_request_each(fleet, states)
        fenced = [(id_, record) for id_, epoch, record in records(fleet, victim, "messages.jsonl") if epoch == 1]
        assert [(id_, record) for id_, _epoch, record in kept] == fenced  # nothing from epoch 1 after the fault


SKEW_S = 300  # five minutes: far past the lease (4 s) and the monitor's staleness (3 s)


def leases(fleet: Fleet) -> dict[str, tuple[int, datetime]]:
    """Every task's lease: its epoch and when it runs out (by the database's clock)."""
    return {uuid: (int(epoch), expires) for uuid, epoch, expires in
            fleet.query("SELECT uuid::text, epoch, expires_at FROM tasuki_leases")}  # fmt: skip


def reap_on(fleet: Fleet, host: Host) -> list[str]:
    """A monitor pass on ``host`` (``tasuki reap``, under the host's clock); its output lines."""
    done = host.run([sys.executable, "-m", "cli.main", "reap"], env=fleet.env(host), cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()


def host_logs(fleet: Fleet, host: Host) -> str:
    return "\n".join(log.read_text(errors="replace") for log in fleet.logs if log.name.startswith(f"{host.hostname}-"))


def test_hosts_whose_clocks_are_minutes_off_take_no_live_lease_are_not_fenced_and_resume_a_dead_hosts_task(
    tmp_path: Path,
) -> None:
    require_libfaketime()
    gate = "clocks-off"
    entries = turns(gate)
    clocks = {"host-1": f"+{SKEW_S}", "host-2": f"-{SKEW_S}"}  # host-3 keeps time (and runs the beat)
    with tasuki_fleet(tmp_path, entries, clocks=clocks) as fleet:
        uuids, _, _ = a_task_on_every_host(fleet, gate)
        ahead, behind, dead = fleet.hosts
        held, first = fleet.holders(), leases(fleet)
        # Every lease lives on past the end it had when its task reached the gate: each holder renews it, whatever
        # its clock, and the database judges it by its own.
        lease = timedelta(seconds=float(TIMINGS["TASUKI__FLEET__LEASE_S"]))
        fleet.wait_until(
            lambda: all(leases(fleet)[u][1] > first[u][1] + lease for u in uuids), "every lease renewed past its end"
        )
        # A monitor pass on the host ahead (to which every lease looks five minutes old) and on the host behind.
        assert reap_on(fleet, ahead) == ["nothing to do"]
        assert reap_on(fleet, behind) == ["nothing to do"]
        assert fleet.holders() == held
        assert {uuid: epoch for uuid, (epoch, _ends) in leases(fleet).items()} == dict.fromkeys(uuids, 1)

        victim = held[dead.hostname]
        dead.kill()  # the host that keeps time, its beat with it: only the hosts whose clocks are off are left
        fleet.model.model.open_gate(gate)
        fleet.wait_until(lambda: lease_expired(fleet.dsn, victim), "the dead host's lease to run out")
        # The host behind resumes the task as soon as the database saw its lease run out; by its own clock that
        # would be five minutes later, past this deadline.
        resumed = fleet.wait_until(
            lambda: [line for line in reap_on(fleet, behind) if line.startswith(f"{victim}  resume")],
            "the host behind to resume the dead host's task",
            timeout_s=SKEW_S / 3,
        )
        assert len(resumed) == 1
        states = fleet.wait_until(lambda: ended(fleet, uuids), "every task to end")
        assert_taken_over_once(fleet, uuids, states, victim, dead)  # the skewed hosts' own tasks: attempt 1, epoch 1
        assert f"this host's clock is {SKEW_S:.1f}s ahead of Redis's" in host_logs(fleet, ahead)
        assert f"this host's clock is {SKEW_S:.1f}s behind Redis's" in host_logs(fleet, behind)
        for host in (ahead, behind):
            assert "this delivery stops writing" not in host_logs(fleet, host)


def task_log(fleet: Fleet, host: Host) -> str:
    return (fleet.root / f"{host.hostname}-tasks.log").read_text(errors="replace")


def deferrals(fleet: Fleet, uuid: str) -> int:
    """How many times a delivery of ``uuid`` was deferred because the fleet's store was out of reach, on any host."""
    deferred = "delivery deferred: the fleet's store is out of reach"
    lines = [line for host in fleet.hosts for line in task_log(fleet, host).splitlines()]
    return sum(1 for line in lines if deferred in line and uuid in line)


def test_postgresql_restarted_mid_task_and_unreachable_when_tasks_start_every_task_completes_once_in_its_first_attempt(
    tmp_path: Path,
) -> None:
    gate = "database-away"
    entries = turns(gate)
    # The lease outlasts the restart: the hosts wait for the database rather than hand their tasks back.
    settings = {"TASUKI__FLEET__LEASE_S": "30", "TASUKI__FLEET__CONNECT_TIMEOUT_S": "1"}
    with tasuki_fleet(tmp_path, entries, settings=settings) as fleet:
        first, _, _ = a_task_on_every_host(fleet, gate)
        # Restarted mid-task: stopped while every host waits for a model answer; each host's next write after it
        # finds no database, and waits.
        fleet.postgres.stop()
        fleet.model.model.open_gate(gate)
        for host in fleet.hosts:
            fleet.wait_until(
                lambda host=host: "fleet store unreachable; trying again" in task_log(fleet, host),
                f"{host.hostname} waiting for the database",
            )
        fleet.postgres.start()
        fleet.wait_until(lambda: ended(fleet, first), "the tasks in flight to end")

        # Unreachable (its packets dropped on the storage host) when three more tasks arrive: each delivery is
        # deferred in one line, takes and writes nothing, and is sent again until the database answers.
        let_through = fleet.database_unreachable()
        second = [fleet.send(fleet.issue(number, f"Log every step ({number})")) for number in (4, 5, 6)]
        fleet.wait_until(lambda: all(deferrals(fleet, uuid) >= 2 for uuid in second), "each delivery deferred twice")
        for host in fleet.hosts:
            assert not [u for u in second if (host.root / "contexts" / "running" / u).exists()]
        let_through()
        uuids = first + second
        states = fleet.wait_until(lambda: ended(fleet, uuids), "every task to end")

        assert {uuid: s["status"] for uuid, s in states.items()} == dict.fromkeys(uuids, "completed")
        assert {uuid: s["attempt"] for uuid, s in states.items()} == dict.fromkeys(uuids, 1)  # no attempt lost
        assert released(fleet) == dict.fromkeys(uuids, 1)  # every lease taken once, by the one holder, released
        for uuid in uuids:
            assert_once_in_the_durable_copy(fleet, uuid, len(entries))
        assert_one_pull_request_each(fleet, states)
        for host in fleet.hosts:
            log = task_log(fleet, host)
            assert "handed back" not in log
            assert only_deferrals_traced(log)
