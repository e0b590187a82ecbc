"""The audit log's file: the hash chain finds a removed, altered, reordered or cut-off line; appends from several
processes keep one chain; secrets never reach the disk; the files are private; ``record_audit`` never raises."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from contexts.audit import AuditLog, Event, audit_dir
from worker.audit import audit_log, audit_path, record_audit
from worker.settings_models import Settings

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def _fill(log: AuditLog, count: int) -> None:
    for i in range(count):
        log.append(Event(at=T0 + timedelta(minutes=i), actor=f"cli:user{i % 3}", action="task.submit",
                         target=f"task-{i}"))


def _rewrite(path: Path, change: Callable[[list[str]], list[str]]) -> None:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(change(lines)))


def test_an_intact_log_verifies_and_reads_back_in_order(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit")
    _fill(log, 5)
    assert log.verify() == []
    assert [line["seq"] for line in log.read()] == [1, 2, 3, 4, 5]
    assert [line["seq"] for line in log.read_reversed()] == [5, 4, 3, 2, 1]
    first = next(iter(log.read()))
    assert first["prev"] == "0" * 64
    assert set(first) == {"seq", "at", "actor", "action", "target", "outcome", "reason", "source", "detail",
                          "prev", "hash"}


def test_an_altered_line_is_named(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit")
    _fill(log, 5)
    _rewrite(log.path, lambda ls: [*ls[:2], ls[2].replace("cli:user2", "cli:someone"), *ls[3:]])
    problems = log.verify()
    assert [p.line for p in problems] == [3]
    assert "altered" in problems[0].message


def test_an_altered_line_with_its_hash_recomputed_breaks_the_next_link(tmp_path: Path) -> None:
    from contexts.audit import line_hash

    log = AuditLog(tmp_path / "audit")
    _fill(log, 5)

    def forge(lines: list[str]) -> list[str]:
        record = json.loads(lines[1])
        record["actor"] = "cli:someone"
        record["hash"] = line_hash(record)
        return [lines[0], json.dumps(record) + "\n", *lines[2:]]

    _rewrite(log.path, forge)
    assert [p.line for p in log.verify()] == [3]


def test_a_removed_line_is_named(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit")
    _fill(log, 5)
    _rewrite(log.path, lambda ls: [*ls[:1], *ls[2:]])
    problems = log.verify()
    assert [p.line for p in problems] == [2]
    assert "removed" in problems[0].message


def test_reordered_lines_are_named(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit")
    _fill(log, 5)
    _rewrite(log.path, lambda ls: [ls[0], ls[1], ls[3], ls[2], ls[4]])
    assert [p.line for p in log.verify()] == [3]


def test_lines_cut_off_the_end_are_found_through_the_head(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit")
    _fill(log, 5)
    _rewrite(log.path, lambda ls: ls[:3])
    problems = log.verify()
    assert [p.line for p in problems] == [4]
    assert "cut off" in problems[0].message


def test_a_torn_last_line_is_cut_before_the_next_append(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit")
    _fill(log, 2)
    with log.path.open("ab") as handle:
        handle.write(b'{"seq":3,"at":"2026')
    log.append(Event(at=T0 + timedelta(hours=1), actor="cli:x", action="task.cancel"))
    assert [line["seq"] for line in log.read()] == [1, 2, 3]
    assert log.verify() == []


def test_since_starts_at_the_first_line_at_or_after_it(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit")
    _fill(log, 50)
    assert [line["seq"] for line in log.read(since=T0 + timedelta(minutes=47))] == [48, 49, 50]
    assert [line["seq"] for line in log.read(since=T0 + timedelta(minutes=46, seconds=30))] == [48, 49, 50]
    assert len(list(log.read(since=T0 - timedelta(days=1)))) == 50
    assert list(log.read(since=T0 + timedelta(days=1))) == []


def test_a_time_earlier_than_the_last_line_is_raised_to_it_so_the_log_stays_in_time_order(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit")
    log.append(Event(at=T0, actor="cli:a", action="task.submit"))
    log.append(Event(at=T0 - timedelta(seconds=1), actor="cli:b", action="task.submit"))
    assert [line["at"] for line in log.read()] == ["2026-12-01T09:00:00.000000Z"] * 2


def test_secrets_in_any_text_never_reach_the_disk(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit")
    token = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2"
    log.append(Event(at=T0, actor="token:alice", action="token.create", target=f"https://x:{token}@github.com/o/r",
                     reason=f"Authorization: Bearer {token}", detail={"nested": [{"header": token}]}))
    on_disk = log.path.read_bytes() + log.head_path.read_bytes()
    assert token.encode() not in on_disk
    assert log.verify() == []


def test_the_directory_is_private_and_the_files_owner_only(tmp_path: Path) -> None:
    log = AuditLog(audit_dir(tmp_path / "contexts"))
    _fill(log, 1)
    assert log.directory == tmp_path / "audit"
    assert stat.S_IMODE(log.directory.stat().st_mode) == 0o700
    for path in log.directory.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def _append_many(directory: str, worker: int, count: int) -> None:
    log = AuditLog(Path(directory))
    for i in range(count):
        log.append(Event(at=datetime.now(UTC), actor=f"cli:proc{worker}", action="task.submit", target=str(i)))


def test_appends_from_several_processes_keep_one_chain(tmp_path: Path) -> None:
    directory = tmp_path / "audit"
    context = multiprocessing.get_context("spawn")  # real separate interpreters, as separate commands are
    processes = [context.Process(target=_append_many, args=(str(directory), w, 40)) for w in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0
    log = AuditLog(directory)
    lines = list(log.read())
    assert [line["seq"] for line in lines] == list(range(1, 161))
    assert {line["actor"] for line in lines} == {f"cli:proc{w}" for w in range(4)}
    assert log.verify() == []


def test_record_audit_writes_beside_the_contexts(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings()
    record_audit(settings, actor="cli:alice", action="task.cancel", target="abc", source="cli",
                 detail={"why": "stuck"}, now=T0)
    (line,) = list(audit_log(settings).read())
    assert (line["actor"], line["action"], line["target"], line["detail"]) == ("cli:alice", "task.cancel", "abc",
                                                                              {"why": "stuck"})
    assert audit_path(settings) == Path(settings.contexts.base_dir).parent / "audit"


def test_record_audit_never_raises_and_logs_an_event_it_could_not_keep(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = make_settings()
    blocked = audit_path(settings)
    blocked.parent.mkdir(parents=True, exist_ok=True)
    blocked.write_text("a file where the directory should be")
    with capture_logs() as logs:
        record_audit(settings, actor="github:bob", action="trigger.refused", reason="read permission", now=T0)
    (entry,) = [e for e in logs if e["event"] == "audit_not_recorded"]
    assert entry["log_level"] == "error"
    assert (entry["actor"], entry["action"], entry["reason"]) == ("github:bob", "trigger.refused", "read permission")
    assert os.path.isfile(blocked)


@pytest.mark.parametrize("action", ["task.submit", "made.up"])
def test_every_action_is_recorded_even_one_outside_the_list(make_settings: Callable[..., Settings],
                                                            action: str) -> None:
    settings = make_settings()
    record_audit(settings, actor="cli:x", action=action, now=T0)
    assert [line["action"] for line in audit_log(settings).read()] == [action]


def test_a_detail_with_keys_named_seq_and_prev_does_not_confuse_the_verifier(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit")
    for _ in range(3):
        log.append(Event(at=T0, actor="cli:x", action="setting.change",
                         detail={"prev": "f" * 64, "seq": 99, "reason": ',"seq":7,"prev":"' + "e" * 64 + '"'}))
    assert log.verify() == []
    _rewrite(log.path, lambda ls: [ls[0], ls[2]])
    assert [p.line for p in log.verify()] == [2]
