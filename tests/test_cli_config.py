"""One source of settings: `tasuki --config FILE` reaches every command, run from any directory.

Each test writes a configuration in ``deploy/`` whose paths are relative (so they must resolve against
``deploy/``), runs the command from an unrelated empty directory with no TASUKI_ variables, and checks
the command acted on what the file names: its context store, its Redis database, its port.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import redis

from cli.embedded import free_port
from contexts import ContextStore
from tests.helpers.context_support import CONFIG, TASK_KEY, wait_for

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[1]
STARTUP_S = 60.0


@dataclass
class Deployment:
    """A configuration file with relative paths, and a working directory that is somewhere else."""

    config: Path
    store_dir: Path
    elsewhere: Path
    redis_url: str

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TASUKI") and k != "OPENAI_API_KEY"}
        env["PYTHONPATH"] = str(REPO_ROOT)
        return env

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "cli.main", "--config", str(self.config), *args]

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args),
            cwd=self.elsewhere,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(*args),
            cwd=self.elsewhere,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def store(self, **kwargs: object) -> ContextStore:
        return ContextStore(self.store_dir, fsync="never", **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def deployment(tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> Deployment:
    deploy, elsewhere = tmp_path / "deploy", tmp_path / "elsewhere"
    deploy.mkdir()
    elsewhere.mkdir()
    port = free_port()
    config = deploy / "config.yaml"
    config.write_text(
        f"broker: {{url: '{redis_url}'}}\n"
        "contexts: {base_dir: store, workspaces_dir: checkouts, stale_after_s: 2, heartbeat_interval_s: 1}\n"
        "monitor: {interval_s: 1}\n"
        "alerts: {disk_warn_gb: 0.0000001, interval_s: 1}\n"
        f"webhook: {{host: 127.0.0.1, port: {port}}}\n"
    )
    return Deployment(config, deploy / "store", elsewhere, redis_url)


def completed_context(deployment: Deployment) -> str:
    context = deployment.store().create(TASK_KEY, CONFIG, user="alice", heartbeat=False)
    context.append_message("user", "Fix the bug")
    context.finish("completed")
    return context.uuid


def stale_running_context(deployment: Deployment) -> str:
    """A running context whose holder is gone: its heartbeat is an hour old."""
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    context = deployment.store(clock=lambda: hour_ago).create(TASK_KEY, CONFIG, user="bob", heartbeat=False)
    context.detach()
    return context.uuid


@pytest.fixture
def stop() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, 15)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)
                process.wait()


def test_context_list_show_and_stats_read_the_configured_store(deployment: Deployment) -> None:
    uuid = completed_context(deployment)

    listed = deployment.run("context", "list")
    shown = deployment.run("context", "show", uuid)
    stats = deployment.run("stats", "--json")

    assert uuid in listed.stdout, listed.stderr
    assert uuid in shown.stdout, shown.stderr
    assert '"total": 1' in stats.stdout, stats.stdout + stats.stderr
    assert not (deployment.elsewhere / "logs").exists()


def test_reap_dry_run_finds_the_lost_task_of_the_configured_store(deployment: Deployment) -> None:
    uuid = stale_running_context(deployment)

    done = deployment.run("reap", "--dry-run")

    assert done.returncode == 0, done.stderr
    assert uuid in done.stdout


def test_retention_dry_run_looks_at_the_configured_store(deployment: Deployment) -> None:
    old = datetime.now(UTC) - timedelta(days=40)
    context = deployment.store(clock=lambda: old).create(TASK_KEY, CONFIG, heartbeat=False)
    context.finish("completed")

    done = deployment.run("retention", "--dry-run")

    assert done.returncode == 0, done.stderr
    assert context.uuid in done.stdout


def test_alerts_use_the_configured_thresholds_and_store(deployment: Deployment) -> None:
    completed_context(deployment)

    done = deployment.run("alerts")

    assert "disk" in done.stdout.lower(), done.stdout + done.stderr
    assert "all clear" not in done.stdout.lower()


def test_submit_and_cancel_use_the_configured_redis(deployment: Deployment, redis_client: redis.Redis) -> None:
    repo = deployment.config.parent / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)

    submitted = deployment.run("submit", "--repo-path", str(repo), "--prompt", "Do the thing.")
    uuid = submitted.stdout.strip().splitlines()[0]
    cancelled = deployment.run("cancel", uuid)

    assert submitted.returncode == 0, submitted.stderr
    assert redis_client.llen("tasks") >= 1
    assert redis_client.exists(f"tasuki:cancel:{uuid}"), cancelled.stdout + cancelled.stderr


def test_worker_serves_the_configured_broker(deployment: Deployment, stop: list[subprocess.Popen[str]]) -> None:
    from celery import Celery

    worker = deployment.start("worker", "-n", "configured@%h", "-P", "solo", "--without-gossip", "--without-mingle")
    stop.append(worker)
    probe = Celery(broker=deployment.redis_url)
    try:
        replies = wait_for(
            lambda: (
                [
                    name
                    for reply in probe.control.ping(timeout=0.5) or []
                    for name in reply
                    if name.startswith("configured@")
                ]
                or None
            ),
            timeout=STARTUP_S,
            what="the worker to answer a ping on the configured broker",
        )
    finally:
        probe.close()
    assert replies


def test_beat_sends_the_monitor_to_the_configured_broker(
    deployment: Deployment, redis_client: redis.Redis, stop: list[subprocess.Popen[str]]
) -> None:
    stop.append(deployment.start("beat"))

    wait_for(lambda: redis_client.llen("maintenance") or None, timeout=STARTUP_S, what="a monitor pass queued")
    # Its schedule file is under local.var_dir (relative to the configuration), never the working directory.
    assert list((deployment.config.parent / "var" / "beat").glob("beat-schedule*"))
    assert list(deployment.elsewhere.iterdir()) == []


@pytest.mark.parametrize("command", [["webhook"], ["up", "--no-beat"]])
def test_the_intake_listens_where_the_configuration_says(
    deployment: Deployment, command: list[str], stop: list[subprocess.Popen[str]]
) -> None:
    stop.append(deployment.start(*command))
    port = int(deployment.config.read_text().split("port: ")[1].split("}")[0])

    def healthy() -> bool | None:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200 or None
        except httpx.HTTPError:
            return None

    assert wait_for(healthy, timeout=STARTUP_S, what="the intake on the configured port")


def test_without_a_config_file_a_command_says_which_defaults_and_directory_it_uses(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASUKI")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "context", "list"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    notes = [line for line in done.stderr.splitlines() if "defaults" in line]
    assert len(notes) == 1
    assert f"relative paths under {REPO_ROOT} " in notes[0]  # beside the checkout, not the working directory
    assert list(tmp_path.iterdir()) == []


def test_celery_with_a_bad_configuration_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("agent: {max_steps: -1}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASUKI")}
    env.update({"PYTHONPATH": str(REPO_ROOT), "TASUKI_CONFIG": str(config)})

    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "worker", "inspect", "ping"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["tasuki: error: config: agent.max_steps = -1: expected greater than 0"]
