"""The running commands through real subprocesses: `tasuki demo`, `tasuki submit --wait`, `tasuki cancel`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.model_server import model_server
from tests.helpers.stack import Stack, fix_calc_trajectory, git, make_buggy_repo

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[1]


def tasuki(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    config = tmp_path / "config.yaml"
    config.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASUKI") and k != "OPENAI_API_KEY"}
    env.update(
        {
            "TASUKI_CONFIG": str(config),
            "PYTHONPATH": str(REPO_ROOT),
            "TASUKI__CONTEXTS__BASE_DIR": str(tmp_path / "contexts"),
            "TASUKI__CONTEXTS__WORKSPACES_DIR": str(tmp_path / "workspaces"),
        }
    )
    env.update(extra)
    return env


def test_demo_fixes_the_failing_test_with_the_replay_model_and_shows_compression(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    env = cli_env(tmp_path, TASUKI__BROKER__URL=redis_url)
    done = tasuki(["demo"], env, tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "replay model" in done.stdout  # it says plainly which model it uses
    assert "Status: completed" in done.stdout
    assert "+    return a + b" in done.stdout  # the diff of the task branch
    [uuid] = os.listdir(tmp_path / "contexts" / "completed")
    state = json.loads((tmp_path / "contexts" / "completed" / uuid / "state.json").read_text())
    assert state["compression_count"] >= 1
    assert "Traceback" not in done.stderr


def test_demo_starts_an_embedded_redis_when_the_broker_does_not_answer(tmp_path: Path) -> None:
    env = cli_env(tmp_path, TASUKI__BROKER__URL="redis://127.0.0.1:9/0")  # the discard port: nothing answers
    done = tasuki(["demo"], env, tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "embedded Redis" in done.stdout
    assert "Status: completed" in done.stdout


@pytest.fixture
def stack(tmp_path: Path, redis_url: str, redis_client: object) -> Iterator[Stack]:
    with model_server(fix_calc_trajectory()) as server:
        s = Stack(tmp_path, redis_url, server.url)
        try:
            yield s
        finally:
            s.stop()


def test_submit_wait_shows_progress_until_the_task_completes(stack: Stack, tmp_path: Path) -> None:
    repo = make_buggy_repo(tmp_path / "repo")
    stack.start_worker("w1")

    done = tasuki(
        ["submit", "--repo-path", str(repo), "--prompt", "Make the tests pass.", "--wait"], stack.env(), tmp_path
    )

    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    uuid = lines[0].strip()
    assert any(line.startswith("completed") for line in lines)
    assert git(repo, "branch", "--list", f"tasuki/p*-{uuid[:8]}").strip()


def test_cancel_of_unknown_and_malformed_uuids_is_one_line_and_nonzero(stack: Stack, tmp_path: Path) -> None:
    bad = tasuki(["cancel", "not-a-uuid"], stack.env(), tmp_path)
    assert bad.returncode != 0
    assert bad.stderr.count("\n") == 1
    assert "not a context UUID" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_tasuki_worker_passes_celery_options_through_and_serves_the_queues(stack: Stack, tmp_path: Path) -> None:
    from tests.helpers.celery_worker import wait_for_ping

    log = tmp_path / "tasuki-worker.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "worker.cli",
                "worker",
                "-n",
                "cliworker@%h",
                "--loglevel",
                "INFO",
                "-c",
                "1",
                "--without-gossip",
                "--without-mingle",
            ],
            cwd=tmp_path,
            env=stack.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for_ping(stack.redis_url, "cliworker@", process, log)  # the -n option reached celery
    finally:
        process.terminate()
        process.wait(timeout=60)
    text = log.read_text()
    for queue in ("tasks", "compression", "maintenance"):  # celery's start-up banner lists its queues
        assert f".> {queue} " in text
