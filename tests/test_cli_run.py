"""The running commands through real subprocesses: `tasuki demo`, `tasuki submit --wait`, `tasuki cancel`."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import redis

from cli.embedded import free_port
from contexts.lock import process_alive
from tests.helpers.celery_worker import wait_for_ping
from tests.helpers.context_support import wait_for
from tests.helpers.model_server import model_server, write_trajectory
from tests.helpers.stack import Stack, fix_calc_trajectory, git, make_buggy_repo
from worker.local_embeddings import local_available

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[1]


def tasuki(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
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
            "TASUKI__CONTEXTS__GIT_CACHE_DIR": str(tmp_path / "git-cache"),
        }
    )
    env.update(extra)
    return env


def test_demo_fixes_the_failing_test_shows_compression_and_a_second_task_that_remembers(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    env = cli_env(tmp_path, TASUKI__BROKER__URL=redis_url, TASUKI_LAUNCHER="./tasuki")  # as the checkout's launcher
    before = set(redis_client.keys("*"))
    done = tasuki(["demo"], env, tmp_path)

    # It ran on a private Redis of its own: nothing queued or stored on the configured one, so another demo
    # or another team's workers there can never take its tasks (nor it theirs).
    assert set(redis_client.keys("*")) == before
    assert "a private embedded Redis" in done.stdout

    assert done.returncode == 0, done.stdout + done.stderr
    assert "replay model" in done.stdout  # it says plainly which model it uses
    if local_available():  # and which embedder recall uses: the local model when tasuki[embeddings] is installed
        assert "recall embeds with the local model all-MiniLM-L6-v2" in done.stdout
    else:
        assert "recall is BM25 only" in done.stdout
    assert "Status: completed" in done.stdout
    assert "+    return a + b" in done.stdout  # the diff of the task branch
    assert re.search(r"in a browser: \./tasuki console, then http://127\.0\.0\.1:8765/console/tasks/[0-9a-f-]{36} "
                     r"\(sign in with the token in \S+var/console-token\)", done.stdout)  # and how to browse it
    assert "look again with: ./tasuki context show " in done.stdout  # the command as the user reached it
    completed = tmp_path / "contexts" / "completed"
    states = {uuid: json.loads((completed / uuid / "state.json").read_text()) for uuid in os.listdir(completed)}
    first, second = sorted(states, key=lambda uuid: states[uuid]["started_at"])
    assert states[first]["compression_count"] >= 1
    assert "Traceback" not in done.stderr
    # Then a second task on the same issue starts with what the first one learned (SPEC §13).
    assert states[second]["status"] == "completed"
    used = states[second]["memory"]
    assert used["thread_memory"]
    assert used["repository_memory"]
    assert "thread memory yes" in done.stdout
    task_message = next(json.loads(line) for line in (completed / second / "messages.jsonl").read_text().splitlines()
                        if json.loads(line)["role"] == "user")
    assert f"Task {first}" in task_message["content"]  # the first task, by its UUID, in the second's first prompt
    assert states[second]["llm_call_count"] == states[first]["llm_call_count"]  # its own whole conversation
    shown = tasuki(["context", "show", second], env, tmp_path)
    assert "Memory: instruction files none; repository memory yes; thread memory yes" in shown.stdout  # the viewer
    assert used["embedder"] == ("all-MiniLM-L6-v2" if local_available() else None)


def test_demo_model_replay_forces_the_replay_model_and_run_elsewhere_leaves_nothing_there(tmp_path: Path) -> None:
    # No configuration file and no path settings: every file goes under the data directory, none where it was run.
    env = {k: v for k, v in cli_env(tmp_path).items() if not k.startswith("TASUKI")}
    env.update(TASUKI__LOCAL__DATA_DIR=str(tmp_path / "data"), TASUKI__BROKER__URL="redis://127.0.0.1:9/0",
               OPENAI_API_KEY="sk-test-not-a-real-key-000000")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = tasuki(["demo", "--model", "replay"], env, elsewhere)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "Tasuki's replay model" in done.stdout
    assert "(--model replay)" in done.stdout
    assert "Status: completed" in done.stdout
    assert list(elsewhere.iterdir()) == []
    assert done.stdout.count(f"data:    {tmp_path / 'data'} (local.data_dir)") == 1
    assert (tmp_path / "data" / "var" / "demo" / "worker.log").is_file()
    assert len(list((tmp_path / "data" / "logs" / "contexts" / "completed").iterdir())) == 2


def test_demo_with_an_api_key_says_which_model_it_uses_and_how_to_force_the_replay_model(tmp_path: Path) -> None:
    env = cli_env(tmp_path, OPENAI_API_KEY="sk-test-not-a-real-key-000000", TASUKI__LLM__OPENAI__MODEL="gpt-test")
    demo = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "demo"], cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        lines = _read_until(demo, "model:")
    finally:
        os.killpg(demo.pid, signal.SIGINT)  # the demo stops its worker and Redis
        demo.wait(timeout=120)
    said = next(line for line in lines if line.startswith("model:"))
    assert "openai model gpt-test" in said
    assert "`tasuki demo --model replay`" in said


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
    branch = git(repo, "branch", "--list", f"tasuki/p*-{uuid[:8]}").strip()
    assert branch
    assert lines[-1] == f"branch: {branch} in {repo}"


def test_submit_wait_of_a_failing_task_prints_its_error_and_exits_1(stack: Stack, tmp_path: Path) -> None:
    repo = make_buggy_repo(tmp_path / "repo")
    stack.env_overrides["TASUKI__AGENT__MAX_STEPS"] = "2"
    stack.start_worker("w1")

    done = tasuki(
        ["submit", "--repo-path", str(repo), "--prompt", "Make the tests pass.", "--wait"], stack.env(), tmp_path
    )

    assert done.returncode == 1, done.stdout + done.stderr
    assert "failed: step limit of 2 reached without finish" in done.stdout.splitlines()


def test_cancel_of_an_unknown_uuid_says_no_such_task_exits_1_and_writes_nothing_to_redis(
    stack: Stack, tmp_path: Path, redis_client: redis.Redis
) -> None:
    unknown = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
    before = set(redis_client.keys("*"))

    done = tasuki(["cancel", unknown], stack.env(), tmp_path)

    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith(f"tasuki: error: no such task {unknown}")
    assert done.stderr.count("\n") == 1
    assert set(redis_client.keys("*")) == before


def test_cancel_of_a_queued_task_revokes_it(stack: Stack, tmp_path: Path, redis_client: redis.Redis) -> None:
    repo = make_buggy_repo(tmp_path / "repo")
    submitted = tasuki(["submit", "--repo-path", str(repo), "--prompt", "Do it."], stack.env(), tmp_path)
    uuid = submitted.stdout.split()[0]

    done = tasuki(["cancel", uuid], stack.env(), tmp_path)

    assert done.returncode == 0, done.stderr
    assert "revoked" in done.stdout
    assert redis_client.exists(f"tasuki:cancel:{uuid}")


def test_cancel_of_unknown_and_malformed_uuids_is_one_line_and_nonzero(stack: Stack, tmp_path: Path) -> None:
    bad = tasuki(["cancel", "not-a-uuid"], stack.env(), tmp_path)
    assert bad.returncode != 0
    assert bad.stderr.count("\n") == 1
    assert "not a context UUID" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_tasuki_worker_passes_celery_options_through_and_serves_the_queues(stack: Stack, tmp_path: Path) -> None:
    log = tmp_path / "tasuki-worker.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cli.main",
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
        # and its compression worker beside it (on a busy machine it may answer a while after the first)
        wait_for_ping(stack.redis_url, "compression-cliworker@", process, log)
    finally:
        process.terminate()
        process.wait(timeout=60)
    text = log.read_text()
    for name in ("tasks", "compression", "maintenance"):  # celery's start-up banner lists its queues
        assert f".> {name} " in text


def _read_until(process: subprocess.Popen[str], marker: str, timeout_s: float = 120) -> list[str]:
    """Lines of ``process``'s stdout up to the one containing ``marker`` (read on a thread, with a deadline)."""
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    stdout = process.stdout
    threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while not any(marker in line for line in seen):
        seen.append(lines.get(timeout=max(deadline - time.monotonic(), 0.1)))
    return seen


class Up:
    """``tasuki up`` as a subprocess in its own session; its output lines are collected on a thread."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "up"], cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.lines: list[str] = []
        stdout = self.process.stdout
        assert stdout is not None
        threading.Thread(target=lambda: [self.lines.append(line) for line in stdout], daemon=True).start()

    def wait_for(self, pattern: str, timeout_s: float = 120) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while True:
            found = re.search(pattern, "".join(self.lines))
            if found:
                return found
            assert self.process.poll() is None or time.monotonic() < deadline, "".join(self.lines)[-3000:]
            assert time.monotonic() < deadline, f"no {pattern!r} in:\n" + "".join(self.lines)[-3000:]
            time.sleep(0.05)  # polling interval, bounded by the deadline

    def kill(self) -> None:
        """Stop it as an operator would, SIGTERM (up stops its services, each in a session of its own), and
        SIGKILL only if that fails: a SIGKILLed up leaves its services running."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def up_env(tmp_path: Path, port: int) -> dict[str, str]:
    return cli_env(
        tmp_path,  # no broker.url: up embeds its own Redis even when one answers on localhost:6379
        TASUKI__WEBHOOK__PORT=str(port),  # the host is up's own default, 127.0.0.1: the tests check it
        TASUKI__LOCAL__VAR_DIR=str(tmp_path / "var"),
    )


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["INT", "TERM", "HUP"])
def test_up_runs_every_service_on_an_embedded_redis_and_a_signal_stops_them_all(
    tmp_path: Path, stop_signal: signal.Signals
) -> None:
    port = free_port()
    up = Up(up_env(tmp_path, port), tmp_path)
    try:
        up.wait_for(r"running \(")
        said = "".join(up.lines)
        # "running" is said once the three Celery workers answered: a task submitted now is taken at once
        ready = re.search(r"workers: +3 ready in [\d.]+ s", said)
        assert ready is not None, said
        assert ready.start() < said.index("running (")
        broker = up.wait_for(r"embedded Redis at (redis://\S+)").group(1)
        pids = [int(m) for m in re.findall(r"pid (\d+)", "".join(up.lines))]
        assert len(pids) == 5  # worker, compression, maintenance, beat, webhook
        wait_for_ping(broker, "tasuki@", up.process, tmp_path / "none.log")  # type: ignore[arg-type]
        wait_for_ping(broker, "compression-tasuki@", up.process, tmp_path / "none.log")  # type: ignore[arg-type]
        wait_for_ping(broker, "maintenance@", up.process, tmp_path / "none.log")  # type: ignore[arg-type]
        up.wait_for(r"webhook +\| ")  # each service's lines carry its name
        console = up.wait_for(r"console: +(http://\S+/console/) \(sign in with the token in (\S+)\)")
        assert _signs_in(console.group(1), Path(console.group(2)).read_text())  # up serves the console, token kept
        if (outside := _non_loopback_address()) is not None:  # the intake and its console: this machine only
            assert not _listens(outside, port)
        assert re.search(r"broker: +embedded Redis at \S+ \(no broker.url configured", "".join(up.lines))
        assert f"data:       {tmp_path} (local.data_dir)" in "".join(up.lines)  # the config file's directory
        recorded = tmp_path / "var" / "embedded-redis.url"
        assert recorded.read_text().strip() == broker
        assert oct(recorded.stat().st_mode & 0o777) == "0o600"

        up.process.send_signal(stop_signal)
        assert up.process.wait(timeout=120) == 0
    finally:
        up.kill()
    assert not any(process_alive(pid) for pid in pids)  # every child was stopped with it
    assert not recorded.exists()
    assert not _answers(broker)  # and the embedded redis-server too


def _signs_in(console: str, token: str) -> bool:
    """Whether the console at ``console`` (once it listens) takes ``token`` and then shows the fleet."""
    import httpx


    def answer() -> httpx.Response | None:
        try:
            return httpx.post(console + "signin", data={"token": token}, follow_redirects=True, timeout=5)
        except httpx.TransportError:
            return None  # not listening yet

    return "<h1>Fleet</h1>" in wait_for(answer, timeout=60, what="the console of tasuki up").text


def test_a_killed_up_takes_its_services_and_its_embedded_redis_with_it(tmp_path: Path) -> None:
    up = Up(up_env(tmp_path, free_port()), tmp_path)
    pids: list[int] = []
    try:
        up.wait_for(r"running \(")
        broker = up.wait_for(r"embedded Redis at (redis://\S+)").group(1)
        pids += [int(m) for m in re.findall(r"pid (\d+)", "".join(up.lines))]
        assert len(pids) == 5
        up.process.kill()  # SIGKILL: up itself cannot stop anything
        up.process.wait()
        wait_for(lambda: not any(process_alive(pid) for pid in pids) or None, timeout=120,
                 what="up's services to stop after up was killed")
        wait_for(lambda: not _answers(broker) or None, timeout=60, what="the embedded Redis to stop")
    finally:
        up.kill()
        for pid in pids:  # what this test failed to see stop
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _non_loopback_address() -> str | None:
    """This machine's address on its default route (no packet is sent), or None on a machine with loopback only."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("198.51.100.1", 9))  # TEST-NET-2: routing only picks the local address
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


def _listens(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex((host, port)) == 0


def _answers(url: str) -> bool:
    from cli.embedded import redis_answers

    return redis_answers(url)


def test_other_commands_find_the_embedded_redis_of_a_running_up(tmp_path: Path) -> None:
    up = Up(up_env(tmp_path, free_port()), tmp_path)
    try:
        broker = up.wait_for(r"embedded Redis at (redis://\S+)").group(1)
        up.wait_for(r"running \(")
        repo = make_buggy_repo(tmp_path / "repo")
        other_shell = tmp_path / "elsewhere"
        other_shell.mkdir()

        done = tasuki(["submit", "--repo-path", str(repo), "--prompt", "Fix it."], up_env(tmp_path, 1), other_shell)

        assert done.returncode == 0, done.stdout + done.stderr
        assert f"using the embedded Redis of `tasuki up` at {broker}" in done.stderr
    finally:
        up.process.send_signal(signal.SIGTERM)
        up.process.wait(timeout=120)
        up.kill()


def test_up_with_a_configured_broker_that_does_not_answer_says_so_in_one_line(tmp_path: Path) -> None:
    env = up_env(tmp_path, free_port())
    env["TASUKI__BROKER__URL"] = "redis://127.0.0.1:9/0"  # chosen explicitly: up never replaces it with its own

    done = tasuki(["up"], env, tmp_path, timeout=60)

    assert done.returncode != 0
    assert done.stderr.splitlines()[-1] == (
        "tasuki: error: the configured broker.url redis://127.0.0.1:9/0 does not answer; start that Redis, or unset "
        "broker.url and TASUKI__BROKER__URL for an embedded one")
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "var" / "redis").exists()


def test_up_says_which_service_died_with_its_exit_code_and_last_lines(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        up = Up(up_env(tmp_path, taken.getsockname()[1]), tmp_path)
        try:
            code = up.process.wait(timeout=120)
        finally:
            up.kill()
    output = "".join(up.lines)
    assert code != 0
    died = re.search(r"webhook exited with code (-?\d+); stopping the others", output)
    assert died is not None, output[-3000:]
    last = output[died.end():]
    assert "address already in use" in last.lower() or "errno 98" in last.lower(), last[-2000:]


def test_replay_model_command_serves_a_trajectory_to_the_official_openai_client(tmp_path: Path) -> None:
    trajectory = write_trajectory(tmp_path / "t.jsonl", [{"content": "hello from the replay model"}])
    port = free_port()
    served = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "replay-model", "--trajectory", str(trajectory), "--port", str(port)],
        cwd=tmp_path,
        env=cli_env(tmp_path),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _read_until(served, f":{port}")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(model="replay", messages=[{"role": "user", "content": "hi"}])
        assert "hello from the replay model" in (reply.choices[0].message.content or "")
    finally:
        served.send_signal(signal.SIGTERM)
        served.wait(timeout=30)


def test_replay_model_command_with_a_missing_file_is_one_line(tmp_path: Path) -> None:
    done = tasuki(["replay-model", "--trajectory", str(tmp_path / "nope.jsonl")], cli_env(tmp_path), tmp_path)
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1
    assert "no trajectory file" in done.stderr


@pytest.mark.parametrize("command", [["submit", "--repo-path", "REPO", "--prompt", "x"], ["reap"]])
def test_commands_needing_redis_say_in_one_line_that_it_does_not_answer(tmp_path: Path, command: list[str]) -> None:
    repo = make_buggy_repo(tmp_path / "repo")
    env = cli_env(tmp_path, TASUKI__BROKER__URL="redis://:secret-password@127.0.0.1:9/0")
    (tmp_path / "contexts").mkdir()

    done = tasuki([str(repo) if arg == "REPO" else arg for arg in command], env, tmp_path)

    assert done.returncode == 69, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1
    assert "Redis does not answer" in done.stderr
    assert "secret-password" not in done.stderr
    assert "Traceback" not in done.stderr


def test_alerts_read_the_files_without_redis_and_warn_that_the_gauges_were_not_published(tmp_path: Path) -> None:
    env = cli_env(tmp_path, TASUKI__BROKER__URL="redis://127.0.0.1:9/0")
    (tmp_path / "contexts").mkdir()

    done = tasuki(["alerts"], env, tmp_path)

    assert done.returncode == 0, done.stderr
    assert "ok: no alerts" in done.stdout
    assert json.loads(done.stderr)["event"] == "alert gauges not published"


def test_demo_without_git_on_path_says_so_in_one_line(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # a PATH with this Python but no git
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    env = cli_env(tmp_path, PATH=str(bin_dir))

    done = tasuki(["demo"], env, tmp_path)

    assert done.returncode == 2
    assert (
        done.stderr
        == "tasuki: error: the demo needs git on PATH (e.g. `apt install git`); everything else it brings itself\n"
    )


def test_demo_without_bubblewrap_runs_unsandboxed_and_says_why(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # a PATH with Python, git and bash, but no bwrap
    bin_dir.mkdir()
    for name, target in (("python", sys.executable), ("git", shutil.which("git")), ("bash", shutil.which("bash"))):
        assert target is not None
        (bin_dir / name).symlink_to(target)
    env = cli_env(tmp_path, PATH=str(bin_dir))

    done = tasuki(["demo"], env, tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr
    said = next(line for line in done.stdout.splitlines() if line.startswith("sandbox:"))
    assert "running unsandboxed because bubblewrap is not installed" in said
    assert "Status: completed" in done.stdout
