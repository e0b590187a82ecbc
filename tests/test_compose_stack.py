"""The compose stack for real (issue 15): the project's images and docker-compose.yml, three worker replicas.

Images: stand-ins for python:3.11-slim and redis:7 made from Debian's packages, then the project's own
Dockerfile (tests/helpers/docker_host.py). Compose: the project's file plus a host-network override
(tests/helpers/compose_stack.py). The model, GitHub's API and the git remote are the test's fakes on the
loopback (tests/helpers/compose_fleet.py). Timings: heartbeat 2 s, stale after 8 s, monitor every 2 s.

Deselect with ``-m "not compose"``; it runs in ``.ci/run``, and elsewhere skips when no Docker can be had.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.helpers.ci import cannot_run
from tests.helpers.compose_fleet import (
    BUSY_DEADLINE_S,
    FLOWER_AUTH,
    GITHUB_SECRET,
    OWNER,
    REPO,
    TEST_TIMINGS,
    Fleet,
    assert_each_step_once,
    compose_fleet,
    healthy_services,
    resumed_after_its_container_dies,
    submit_held,
)
from tests.helpers.deliveries import github_delivery, load_payload
from tests.helpers.docker_host import DockerUnavailable

pytestmark = [pytest.mark.integration, pytest.mark.compose, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    try:
        with compose_fleet(tmp_path_factory.mktemp("compose"), TEST_TIMINGS) as running:
            yield running
    except DockerUnavailable as exc:
        cannot_run(str(exc))


def test_every_service_of_the_stack_becomes_healthy_with_three_workers(fleet: Fleet) -> None:
    services = healthy_services(fleet, BUSY_DEADLINE_S)

    assert services == ["beat", "flower", "maintenance", "redis", "webhook", "worker", "worker", "worker"]


# The agent's bash tool, run inside a worker container (``docker exec``): a tiny project's files are written to
# a checkout and the command runs there through the same sandbox, environment and limits as the agent's.
IN_THE_SANDBOX = """
import json, sys, tempfile
from pathlib import Path
from worker.runtime import settings
from sandbox.jail import make_sandbox
from agent.tools import Workspace, run_tool
files, command = json.loads(sys.argv[1]), sys.argv[2]
with tempfile.TemporaryDirectory(prefix="toolchain-") as root:
    for name, text in files.items():
        Path(root, name).parent.mkdir(parents=True, exist_ok=True)
        Path(root, name).write_text(text)
    sandbox = settings().sandbox
    result = run_tool(Workspace(Path(root)), "bash", {"command": command}, bash_timeout_s=600,
                      max_output_chars=100000, sandbox=make_sandbox(sandbox), limits=sandbox.limits)
print(result.output)
"""
# One tiny project per toolchain of the Dockerfile's TOOLCHAINS: its files, the compile-and-test command, and
# what its output must say.
PROJECTS: dict[str, tuple[dict[str, str], str, str]] = {
    "python": (
        {
            "tiny/__init__.py": "def add(a, b):\n    return a + b\n",
            "tests/__init__.py": "",
            "tests/test_add.py": "import unittest\nfrom tiny import add\n\n\nclass Add(unittest.TestCase):\n"
                                 "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n",
        },
        "python3 -c 'import sys; print(\"prefix\", sys.prefix)'; python3 -c 'import celery' 2>&1 | tail -1; "
        "python3 -m venv .venv && .venv/bin/python -m compileall -q tiny && .venv/bin/python -m unittest -v",
        "test_add (tests.test_add.Add",
    ),
    "node": (
        {
            "package.json": json.dumps({"name": "tiny", "version": "1.0.0", "scripts": {"test": "node --test"}}),
            "index.js": "exports.add = (a, b) => a + b;\n",
            "test/add.test.js": "const test = require('node:test');\nconst assert = require('node:assert');\n"
                                "const { add } = require('..');\n"
                                "test('adds', () => assert.strictEqual(add(2, 3), 5));\n",
        },
        "npm_config_update_notifier=false npm test",
        "# pass 1",
    ),
    "go": (
        {
            # A three-part go line, as most maintained modules carry: Debian bookworm's own go 1.19 cannot read it
            "go.mod": "module example.com/tiny\n\ngo 1.21.0\n",
            "add.go": "package tiny\n\nfunc Add(a, b int) int { return a + b }\n",
            "add_test.go": "package tiny\n\nimport \"testing\"\n\nfunc TestAdd(t *testing.T) {\n"
                           "\tif Add(2, 3) != 5 {\n\t\tt.Fatal(\"add\")\n\t}\n}\n",
        },
        "go vet ./... && go test -v ./...",
        "--- PASS: TestAdd",
    ),
    "java": (
        {
            "Main.java": "public class Main {\n  static int add(int a, int b) { return a + b; }\n"
                         "  public static void main(String[] args) {\n"
                         "    if (add(2, 3) != 5) throw new AssertionError(\"add\");\n"
                         "    System.out.println(\"java ok\");\n  }\n}\n",
        },
        "mvn --version | head -1 && javac -d out Main.java && java -cp out Main",
        "java ok",
    ),
    "rust": (
        {
            # Edition 2024 needs Rust 1.85: Debian bookworm's own rustc (1.63) refuses it
            "Cargo.toml": '[package]\nname = "tiny"\nversion = "0.1.0"\nedition = "2024"\nrust-version = "1.85"\n',
            "src/lib.rs": "pub fn add(a: i32, b: i32) -> i32 { a + b }\n\n#[cfg(test)]\nmod tests {\n"
                          "    #[test]\n    fn adds() { assert_eq!(super::add(2, 3), 5); }\n}\n",
        },
        "cargo test --offline 2>&1",
        "test tests::adds ... ok",
    ),
    "build": (
        {
            "add.c": "int add(int a, int b) { return a + b; }\n",
            "test.c": "#include <assert.h>\n#include <stdio.h>\nint add(int, int);\n"
                      "int main(void) { assert(add(2, 3) == 5); puts(\"c ok\"); return 0; }\n",
            "Makefile": "test: test_add\n\t./test_add\n\ntest_add: test.c add.c\n\tcc -Wall -o $@ $^\n",
        },
        "make test",
        "c ok",
    ),
}


def test_the_workers_say_every_toolchain_of_the_image_runs_in_their_sandbox(fleet: Fleet) -> None:
    workers = fleet.stack.containers("worker")

    def probed() -> list[str] | None:
        said = []
        for container in workers:
            done = fleet.stack.engine.docker("logs", container, check=False)
            lines = [line for line in (done.stdout + done.stderr).splitlines()
                     if "toolchains probed in the sandbox" in line or "cannot run in the sandbox" in line]
            if not any("toolchains probed" in line for line in lines):
                return None
            said += lines
        return said

    lines = fleet.stack.wait(probed, BUSY_DEADLINE_S, "each worker to probe its toolchains", logs_of="worker")
    assert not [line for line in lines if "cannot run in the sandbox" in line], lines
    probed_line = next(line for line in lines if "toolchains probed" in line)
    for name in ("python", "node", "go", "cargo", "rustc", "java", "maven", "gcc", "make"):
        assert re.search(rf"['\"]{name}['\"]", probed_line), probed_line


def test_the_workers_restore_environments_by_layers(fleet: Fleet) -> None:
    """The image's worker (its own user, not root; the workspaces on a volume) passes the layers' probe at start."""

    def said() -> list[str] | None:
        lines = []
        for container in fleet.stack.containers("worker"):
            done = fleet.stack.engine.docker("logs", container, check=False)
            found = [line for line in (done.stdout + done.stderr).splitlines() if "environments are restored" in line]
            if not found:
                return None
            lines += found
        return lines

    lines = fleet.stack.wait(said, BUSY_DEADLINE_S, "each worker to say how it restores", logs_of="worker")
    assert all("restored by layers" in line for line in lines), lines


@pytest.mark.parametrize("toolchain", list(PROJECTS))
def test_a_tiny_project_compiles_and_passes_its_tests_in_a_workers_sandbox(fleet: Fleet, toolchain: str) -> None:
    files, command, said = PROJECTS[toolchain]
    worker = fleet.stack.containers("worker")[0]

    done = fleet.stack.engine.docker("exec", worker, "python", "-c", IN_THE_SANDBOX, json.dumps(files), command,
                                     timeout_s=900)

    assert said in done.stdout, done.stdout
    assert done.stdout.rstrip().endswith("exit code: 0"), done.stdout
    if toolchain == "python":  # the agent's python3 is the image's, never Tasuki's own virtualenv
        assert "prefix /app/venv" not in done.stdout
        assert "No module named 'celery'" in done.stdout


def test_a_task_through_the_webhook_and_one_through_tasuki_submit_complete_in_the_sandbox(fleet: Fleet) -> None:
    fleet.forge.add_item(OWNER, REPO, 1, "Spelling error in the README file", "commmit", labels=["bug"])
    payload = load_payload("github/issues.labeled.json")
    fleet.forge.roles[payload["sender"]["login"]] = "write"  # the labeller may trigger (issue 40's forge check)
    body, headers = github_delivery("issues", payload, GITHUB_SECRET)
    answer = httpx.post(f"http://127.0.0.1:{fleet.stack.ports.webhook}/webhooks/github", content=body,
                        headers=headers, timeout=30)
    assert answer.status_code == 202, answer.text
    through_webhook = answer.json()["task_id"]
    through_submit = fleet.submit(fleet.new_issue())

    for uuid in (through_webhook, through_submit):
        state = fleet.wait_finished(uuid)
        assert state["status"] == "completed", state
        tool_results = [m["content"] for m in fleet.messages(uuid) if m["role"] == "tool"]
        assert tool_results[0].splitlines()[0].strip() == "bwrap", tool_results[0]  # the agent's bash was sandboxed
        assert_each_step_once(fleet, uuid)
    assert fleet.forge.item(OWNER, REPO, 1).labels == ["coding agent done"]


@pytest.mark.parametrize("how", ["kill", "restart"])
def test_a_worker_container_that_dies_mid_task_never_strands_its_task(fleet: Fleet, how: str) -> None:
    number, uuid = submit_held(fleet)

    resumed_after_its_container_dies(fleet, number, uuid, how)


def test_flower_lists_the_tasks(fleet: Fleet) -> None:
    finished = sorted(p.name for p in (fleet.contexts / "completed").iterdir())
    assert len(finished) >= 4

    def listed() -> dict[str, Any] | None:
        answer = httpx.get(f"http://127.0.0.1:{fleet.stack.ports.flower}/api/tasks", auth=FLOWER_AUTH, timeout=10)
        tasks: dict[str, Any] = answer.json() if answer.status_code == 200 else {}
        return tasks if set(finished) <= set(tasks) else None

    tasks = fleet.stack.wait(listed, 60, "Flower to list every finished task", logs_of="flower")
    assert {tasks[uuid]["name"] for uuid in finished} == {"tasuki.run_task"}
    unauthorised = httpx.get(f"http://127.0.0.1:{fleet.stack.ports.flower}/api/tasks", timeout=10)
    assert unauthorised.status_code == 401


def test_compose_down_and_up_again_loses_nothing_queued_or_running(fleet: Fleet) -> None:
    # Held at the gate until its worker is shutting down: the SIGTERM always lands mid-task, however slow the
    # machine, and the task hands back at the step the released answer completes. (Before the monitor waited for a
    # delivery still in the queue, it failed this task in busy runs: every worker was stopped long enough for it to
    # count three re-enqueues that nobody could take.)
    number = fleet.new_issue(held=True)
    running = fleet.submit(number)
    fleet.stack.wait(lambda: fleet.held(number), BUSY_DEADLINE_S, f"task {running} to be mid-task", logs_of="worker")
    holder = fleet.holder_container(running)

    def holder_stopping() -> bool:
        done = fleet.stack.engine.docker("logs", "--tail", "50", holder, check=False)
        return "worker shutting down" in done.stdout + done.stderr

    with ThreadPoolExecutor(1) as pool:
        stopping = pool.submit(fleet.stack.compose, "stop", "worker", timeout_s=300)  # SIGTERM: handed back
        fleet.stack.wait(holder_stopping, BUSY_DEADLINE_S, "the holder to begin its warm shutdown", logs_of="worker")
        fleet.release(number)
        stopping.result()
    stopped = fleet.stack.logs("worker", tail=400)
    assert "task handed back on shutdown" in stopped, stopped[-8000:]
    queued = fleet.submit(fleet.new_issue())  # no worker is up to take it

    fleet.stack.down()  # containers gone; the named volumes (Redis's append-only file, contexts) stay
    ended = fleet.completed_state(running)
    assert ended is None, (ended.get("error"), ended, stopped[-8000:])
    assert fleet.completed_state(queued) is None
    fleet.stack.up()

    for uuid in (running, queued):
        state = fleet.wait_finished(uuid)
        assert state["status"] == "completed", (state.get("error"), state, fleet.stack.logs("worker")[-6000:])
        assert_each_step_once(fleet, uuid)
