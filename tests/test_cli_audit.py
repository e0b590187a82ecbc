"""``tasuki audit`` as an operator runs it: the events filtered, and ``--verify`` naming the first removed, altered or
reordered line with exit code 65 — through the installed command, in a process of its own."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis

from contexts.audit import AuditLog, Event, audit_dir
from tests.helpers.cli_process import ok, one_line_error

REPO = Path(__file__).resolve().parents[1]
NOW = datetime.now(UTC)


def tasuki(base: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """Run ``tasuki ARGS`` against the contexts root ``base`` from an empty directory."""
    script = Path(sys.executable).with_name("tasuki")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "cli.main"]
    (base.parent / "empty.yaml").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASUKI")}
    env |= {"TASUKI_CONFIG": str(base.parent / "empty.yaml"), "TASUKI__CONTEXTS__BASE_DIR": str(base),
            "PYTHONPATH": str(REPO), **extra}
    return subprocess.run([*command, *args], capture_output=True, text=True, env=env, cwd=base.parent,
                          timeout=120, check=False)


@pytest.fixture
def base(tmp_path: Path) -> Path:
    log = AuditLog(audit_dir(tmp_path / "contexts"))
    events = [("github:alice", "trigger.admitted", ""), ("github:mallory", "trigger.refused", "read permission"),
              ("cli:bob", "task.submit", ""), ("oidc:carol", "task.cancel", ""), ("cli:bob", "task.cancel", "")]
    for i, (actor, action, reason) in enumerate(events):
        log.append(Event(at=NOW - timedelta(hours=5 - i), actor=actor, action=action, target=f"o/r#{i}",
                         reason=reason, outcome="refused" if reason else "ok"))
    return tmp_path / "contexts"


def _lines(base: Path) -> list[str]:
    return (audit_dir(base) / "audit.jsonl").read_text().splitlines(keepends=True)


def _write(base: Path, lines: list[str]) -> None:
    (audit_dir(base) / "audit.jsonl").write_text("".join(lines))


def test_lists_every_event_oldest_first_with_the_reason_of_a_refusal(base: Path) -> None:
    text = ok(tasuki(base, "audit")).splitlines()
    assert [line.split()[2] for line in text] == ["github:alice", "github:mallory", "cli:bob", "oidc:carol", "cli:bob"]
    assert text[1].endswith("o/r#1  refused  (read permission)")


def test_filters_by_actor_action_and_since_and_prints_json(base: Path) -> None:
    assert [json.loads(x)["target"] for x in ok(tasuki(base, "audit", "--actor", "cli:bob", "--json")).split()] == [
        "o/r#2", "o/r#4"]
    assert len(ok(tasuki(base, "audit", "--action", "task.*")).splitlines()) == 3
    assert len(ok(tasuki(base, "audit", "--actor", "github:*", "--action", "trigger.refused")).splitlines()) == 1
    assert len(ok(tasuki(base, "audit", "--since", "150m")).splitlines()) == 2
    since = (NOW - timedelta(hours=2, minutes=30)).isoformat()
    assert len(ok(tasuki(base, "audit", "--since", since, "--limit", "0")).splitlines()) == 2
    assert len(ok(tasuki(base, "audit", "--limit", "1")).splitlines()) == 1


def test_an_intact_log_verifies(base: Path) -> None:
    assert "intact" in ok(tasuki(base, "audit", "--verify"))


@pytest.mark.parametrize(
    ("change", "line", "words"),
    [
        (lambda ls: [*ls[:2], ls[2].replace("cli:bob", "cli:eve"), *ls[3:]], 3, "altered"),
        (lambda ls: [*ls[:1], *ls[2:]], 2, "removed"),
        (lambda ls: [ls[0], ls[2], ls[1], *ls[3:]], 2, "seq 3 where seq 2 was due"),
        (lambda ls: ls[:4], 5, "cut off the end"),
    ],
    ids=["altered", "removed", "reordered", "cut-off"],
)
def test_verify_names_the_first_broken_line_and_exits_65(
    base: Path, change: Callable[[list[str]], list[str]], line: int, words: str
) -> None:
    _write(base, change(_lines(base)))
    result = tasuki(base, "audit", "--verify")
    assert result.returncode == 65, result.stderr
    assert "Traceback" not in result.stderr
    (warning,) = result.stderr.splitlines()
    assert warning.startswith(f"tasuki: warning: audit log broken at line {line}: ")
    assert words in warning


def test_bad_input_is_one_line_and_exit_2(base: Path) -> None:
    assert "--since 'last tuesday'" in one_line_error(tasuki(base, "audit", "--since", "last tuesday"), 2)
    assert "negative" in one_line_error(tasuki(base, "audit", "--limit", "-1"), 2)


def test_an_empty_log_lists_nothing_and_verifies(tmp_path: Path) -> None:
    assert ok(tasuki(tmp_path / "contexts", "audit")) == ""
    assert "intact" in ok(tasuki(tmp_path / "contexts", "audit", "--verify"))


def test_submit_and_cancel_are_recorded_as_the_unix_user(tmp_path: Path, redis_url: str,
                                                         redis_client: redis.Redis) -> None:
    base = tmp_path / "contexts"
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    env = {"TASUKI__BROKER__URL": redis_url}
    uuid = ok(tasuki(base, "submit", "--repo-path", str(repo), "--prompt", "Do the thing.", **env)).split()[0]
    ok(tasuki(base, "cancel", uuid, **env))
    unknown = "00000000-0000-4000-8000-000000000000"
    one_line_error(tasuki(base, "cancel", unknown, **env), 1)

    events = [json.loads(x) for x in ok(tasuki(base, "audit", "--json")).splitlines()]
    user = f"cli:{getpass.getuser()}"
    assert [(e["actor"], e["action"], e["target"], e["outcome"], e["source"]) for e in events] == [
        (user, "task.submit", uuid, "ok", "cli"), (user, "task.cancel", uuid, "ok", "cli"),
        (user, "task.cancel", unknown, "refused", "cli")]
    assert events[0]["detail"]["task_key"]["task_source"] == "local"
    assert "no such task" in events[2]["reason"]
    assert redis_client.exists(f"tasuki:cancel:{uuid}")
