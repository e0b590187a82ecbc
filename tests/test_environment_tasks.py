"""Whole tasks in their repository's environment (SPEC §17): built once, restored for the next task, offline.

Real tasks (TaskRun in this process, the replay model over HTTP), real bubblewrap, real git, and real pip against
a package index on loopback that logs every request.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import uuid as uuid_module
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contexts import ContextStore
from replay import ReplayModel, serve
from replay.trajectory import turns_from_entries
from tests.helpers.ci import bubblewrap_here
from tests.helpers.context_support import wait_for
from tests.helpers.package_index import INDEX_HOST, INDEX_INTERNAL, PackageIndex, make_wheel, package_index
from tests.helpers.schemas import read_jsonl_lines, validate_context_dir
from tests.helpers.stack import git, make_buggy_repo
from tests.helpers.worker_scenarios import provider_env
from worker.run import TaskRequest, TaskRun
from worker.runtime import provider_for
from worker.settings_models import Settings
from worker.user_config import llm_config

pytestmark = pytest.mark.integration
BASE_PYTHON = sys._base_executable  # the interpreter this test's venv was made from: the setup makes its own venv
IMPORT = ".venv/bin/python -c 'import tinypkg; print(\"tinypkg says\", tinypkg.VALUE)'"
SECRET = "reg-s3cret-0123456789abcdef"


@pytest.fixture(scope="module", autouse=True)
def _bubblewrap() -> None:
    bubblewrap_here()


@pytest.fixture
def index(tmp_path: Path) -> Iterator[PackageIndex]:
    with package_index() as served:
        served.add(make_wheel(tmp_path / "wheels", "tinypkg", "1.0", {"tinypkg/__init__.py": "VALUE = 42\n"}))
        yield served


def repo_with_setup(path: Path, script: str) -> Path:
    """The calc repository with ``.tasuki/setup.sh``; its .gitignore does not list .venv (the case that pushed one)."""
    repo = make_buggy_repo(path)
    (repo / ".tasuki").mkdir()
    (repo / ".tasuki" / "setup.sh").write_text(script)
    (repo / ".gitignore").write_text("*.log\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "setup")
    return repo


def venv_setup(index_url: str) -> str:
    return (
        f"{BASE_PYTHON} -m venv .venv\n"
        f".venv/bin/pip install -q --no-cache-dir --disable-pip-version-check --index-url {index_url} tinypkg\n"
    )


def run_task(
    make_settings: Callable[..., Settings], repo: Path, commands: list[str], env: dict[str, str] | None = None
) -> tuple[dict[str, Any], Path, list[dict[str, Any]]]:
    """One task that runs ``commands`` with bash and finishes; its outcome, context directory and model requests."""
    turns = [
        {"content": f"step {n}", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]}
        for n, command in enumerate(commands)
    ]
    turns.append({"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"summary": "ran the checks"}}]})
    server = serve(ReplayModel(turns_from_entries(turns)))
    try:
        settings = make_settings(
            {
                **provider_env("openai", server.url, 32768),
                "TASUKI__SANDBOX__READ_ONLY_PATHS": json.dumps([sys.base_prefix]),
                "TASUKI__SANDBOX__ALLOWED_INTERNAL": json.dumps([INDEX_INTERNAL]),  # the index, through the proxy
                **(env or {}),
            }
        )
        uuid = str(uuid_module.uuid4())
        request = TaskRequest(
            {"task_source": "local", "owner": "local", "repo": repo.name, "task_type": "prompt", "task_id": uuid[:8]},
            prompt="Check the package.",
            repo_path=str(repo),
        )
        store = ContextStore(settings.contexts.base_dir, fsync="never")
        outcome = TaskRun(
            uuid, request, settings, store, provider_for=lambda config: provider_for(config, settings)
        ).execute(llm_config(settings))
    finally:
        server.stop()
    directory = store.completed_path(uuid)
    validate_context_dir(directory)  # the setup record keeps tools.jsonl valid against the project's schema
    return outcome, directory, [r for r in server.requests if r["kind"] == "agent"]


def setup_record(directory: Path) -> dict[str, Any]:
    (record,) = [r for r in read_jsonl_lines(directory / "tools.jsonl") if r["tool_name"] == "setup"]
    return record


def bash_outputs(directory: Path) -> list[str]:
    return [str(r["result"]) for r in read_jsonl_lines(directory / "tools.jsonl") if r["tool_name"] == "bash"]


def first_user_message(directory: Path) -> str:
    return next(r["content"] for r in read_jsonl_lines(directory / "messages.jsonl") if r["role"] == "user")


@pytest.mark.parametrize("restore", ["layers", "copy"])
def test_the_first_task_builds_the_next_restores_without_pip_and_runs_offline(
    tmp_path: Path, make_settings: Callable[..., Settings], index: PackageIndex, restore: str
) -> None:
    repo = repo_with_setup(tmp_path / "repo", venv_setup(index.url))
    how = {"TASUKI__ENVIRONMENTS__RESTORE": restore}

    first, first_dir, _ = run_task(
        make_settings, repo, [IMPORT, "echo 'def add(a, b):\n    return a + b' > calc.py"], how
    )
    assert first["status"] == "completed", first
    built = setup_record(first_dir)
    assert built["result"]["outcome"] == "built", built
    assert built["result"]["source"] == ".tasuki/setup.sh"
    assert built["result"]["exit_code"] == 0
    assert ".venv/" in built["result"]["created"]
    assert "tinypkg says 42" in bash_outputs(first_dir)[0]
    asked = len(index.requests)
    assert any("/simple/tinypkg/" in path for path in index.requests)
    # The virtualenv was never committed, though the repository's .gitignore does not list it.
    assert ".venv" not in git(repo, "ls-tree", "-r", "--name-only", first["branch"])
    assert "calc.py" in git(repo, "diff", "--name-only", "main", first["branch"])

    shutil.rmtree(tmp_path / "workspaces" / ".idle")  # a fresh warm copy: its environment comes from the snapshot
    key = built["result"]["key"]
    if restore == "copy":
        wait_for((tmp_path / "environments" / ".spares" / key).is_dir, timeout=60, what="the spare")
    pip_offline = (
        f".venv/bin/pip download -q --no-cache-dir --disable-pip-version-check --retries 0 --timeout 5 "
        f"--index-url {index.url} -d /tmp/dl tinypkg; echo pip-exit=$?"
    )
    second, second_dir, _ = run_task(
        make_settings, repo, [IMPORT, pip_offline], {"TASUKI__SANDBOX__NETWORK": "none", **how}
    )
    assert second["status"] == "completed", second
    restored = setup_record(second_dir)
    assert restored["result"]["outcome"] == "restored", restored
    assert restored["result"]["key"] == built["result"]["key"]
    # copy: the spare made after the publish, moved into place; layers: nothing copied, and no spare ever made
    assert (restored["result"]["spare"], restored["result"]["layers"]) == (restore == "copy", restore == "layers")
    if restore == "layers":
        assert spares(tmp_path) == []
    outputs = bash_outputs(second_dir)
    assert "tinypkg says 42" in outputs[0]  # the restored environment works, with no network at all
    assert "pip-exit=0" not in outputs[1]  # the agent's commands had no network
    assert len(index.requests) == asked  # and the restore asked the index nothing
    state = json.loads((second_dir / "state.json").read_text())
    assert state["environment"]["line"].startswith("restored in ")


def spares(root: Path) -> list[str]:
    """What the host's spares directory holds: ``<key>`` ready, ``.building-*`` being made."""
    directory = root / "environments" / ".spares"
    return sorted(entry.name for entry in directory.iterdir()) if directory.is_dir() else []


def released(fifo: Path) -> bool:
    """Whether a writer could open ``fifo`` (its reader, the agent's command, is waiting on it) and let it go on."""
    try:
        descriptor = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # not there yet, or no reader yet (ENXIO)
        return False
    try:
        os.write(descriptor, b"go\n")
    finally:
        os.close(descriptor)
    return True


def test_the_spare_and_the_deletion_of_a_changed_environment_wait_until_the_task_is_over(
    tmp_path: Path, copy_settings: Callable[..., Settings], index: PackageIndex
) -> None:
    """Copying the next spare and deleting the environment an agent changed would run beside the task's own commands
    (its tests): both wait for the task's end."""
    repo = repo_with_setup(tmp_path / "repo", venv_setup(index.url))
    _, first_dir, _ = run_task(copy_settings, repo, [IMPORT])
    key = setup_record(first_dir)["result"]["key"]
    wait_for(lambda: spares(tmp_path) == [key], timeout=60, what="the spare made after the first task")
    _, second_dir, _ = run_task(copy_settings, repo, ["touch .venv/changed-by-the-agent"])
    assert setup_record(second_dir)["result"]["outcome"] == "reused"

    seen: dict[str, Any] = {}
    hold = "mkfifo $HOME/hold && read line < $HOME/hold && echo released-$line"
    third = threading.Thread(target=lambda: seen.update(task=run_task(copy_settings, repo, [IMPORT, hold])))
    third.start()
    try:
        fifo = wait_for(lambda: next((tmp_path / "workspaces").glob("*.home/hold"), None), timeout=120,
                        what="the agent's command waiting")
        # The agent's command is running: its restore took the spare and none is being made; the changed
        # environment was moved out of the checkout and is not being deleted.
        during = spares(tmp_path), [len(os.listdir(d)) for d in (tmp_path / "workspaces").glob(".discarded-*")]
    finally:
        wait_for(lambda: released(fifo), timeout=60, what="the agent's command reading")
        third.join(timeout=120)
    outcome, third_dir, _ = seen["task"]
    assert outcome["status"] == "completed", outcome
    restored = setup_record(third_dir)["result"]
    assert (restored["outcome"], restored["spare"]) == ("restored", True)
    outputs = bash_outputs(third_dir)
    assert "tinypkg says 42" in outputs[0]
    assert "released-go" in outputs[1]
    assert during == ([], [1])
    wait_for(lambda: spares(tmp_path) == [key], timeout=60, what="the spare made again once the task was over")
    wait_for(lambda: not list((tmp_path / "workspaces").glob(".discarded-*")), timeout=60,
             what="the changed environment deleted once the task was over")


def test_a_task_that_fails_after_its_restore_still_leaves_the_spare_made_again(
    tmp_path: Path, copy_settings: Callable[..., Settings], index: PackageIndex
) -> None:
    repo = repo_with_setup(tmp_path / "repo", venv_setup(index.url))
    _, first_dir, _ = run_task(copy_settings, repo, [IMPORT])
    key = setup_record(first_dir)["result"]["key"]
    wait_for(lambda: spares(tmp_path) == [key], timeout=60, what="the spare made after the first task")
    shutil.rmtree(tmp_path / "workspaces" / ".idle")

    outcome, second_dir, _ = run_task(copy_settings, repo, [IMPORT, IMPORT], {"TASUKI__AGENT__MAX_STEPS": "1"})
    assert outcome["status"] == "failed", outcome  # the step limit, after the restore that took the spare
    assert setup_record(second_dir)["result"]["spare"] is True
    wait_for(lambda: spares(tmp_path) == [key], timeout=60, what="the spare made again after the failed task")


def test_the_next_task_on_a_warm_copy_reuses_its_environment_unless_an_agent_changed_it(
    tmp_path: Path, copy_settings: Callable[..., Settings], index: PackageIndex
) -> None:
    repo = repo_with_setup(tmp_path / "repo", venv_setup(index.url))
    _, first_dir, _ = run_task(copy_settings, repo, [IMPORT])
    assert setup_record(first_dir)["result"]["outcome"] == "built"
    asked = len(index.requests)
    module = ".venv/lib/python*/site-packages/tinypkg/__init__.py"
    show = f"cat {module}"
    # The agent rewrites a file of its environment with content of the same size and puts its mtime back: only
    # the file's change time (set by the kernel) tells.
    tamper = (
        f"f=$(echo {module}); cp -p $f /tmp/ref && printf 'VALUE = 24\\n' > $f && touch -r /tmp/ref $f && "
        "cat $f"
    )

    second, second_dir, _ = run_task(copy_settings, repo, [IMPORT, tamper])
    assert second["status"] == "completed", second
    reused = setup_record(second_dir)["result"]
    assert reused["outcome"] == "reused", reused
    assert reused["key"] == setup_record(first_dir)["result"]["key"]
    assert reused["created"] == [".venv/"]
    outputs = bash_outputs(second_dir)
    assert "tinypkg says 42" in outputs[0]  # the environment its previous task built, as it was
    assert "VALUE = 24" in outputs[1]
    assert json.loads((second_dir / "state.json").read_text())["environment"]["line"].startswith("reused in ")
    assert len(index.requests) == asked
    snapshot_module = next((tmp_path / "environments").glob(f"*/*/checkout/{module}"))
    assert snapshot_module.read_text() == "VALUE = 42\n"  # the agent's change never reached the snapshot

    third, third_dir, _ = run_task(copy_settings, repo, [show])
    assert setup_record(third_dir)["result"]["outcome"] == "restored"  # changed: not reused, restored afresh
    assert "VALUE = 42" in bash_outputs(third_dir)[0]

    fourth, fourth_dir, _ = run_task(copy_settings, repo, [IMPORT])
    assert setup_record(fourth_dir)["result"]["outcome"] == "reused"  # that restore is the next one's to reuse
    assert "tinypkg says 42" in bash_outputs(fourth_dir)[0]
    assert len(index.requests) == asked
    for outcome in (second, third, fourth):
        assert outcome.get("unchanged") is True  # the environment was never part of any commit


def test_a_warm_copys_environment_of_another_key_or_of_no_declaration_is_gone_before_the_agent_starts(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    repo = repo_with_setup(tmp_path / "repo", "mkdir -p build && echo one > build/one.txt\n")
    listing = "ls build 2>&1; echo listed"
    no_auto = {"TASUKI__ENVIRONMENTS__AUTO": "false"}  # nothing detected either, once the setup is gone
    _, first_dir, _ = run_task(make_settings, repo, [listing], no_auto)
    assert setup_record(first_dir)["result"]["outcome"] == "built"
    _, second_dir, _ = run_task(make_settings, repo, [listing], no_auto)
    assert setup_record(second_dir)["result"]["outcome"] == "reused"
    assert "one.txt" in bash_outputs(second_dir)[0]

    (repo / ".tasuki" / "setup.sh").write_text("mkdir -p build && echo two > build/two.txt\n")
    git(repo, "commit", "-q", "-am", "another setup: another key")
    _, third_dir, _ = run_task(make_settings, repo, [listing], no_auto)
    assert setup_record(third_dir)["result"]["outcome"] == "built"
    assert bash_outputs(third_dir)[0].split()[:2] == ["two.txt", "listed"]  # the other key's file is gone

    git(repo, "rm", "-q", "-r", ".tasuki")
    git(repo, "commit", "-q", "-m", "no setup")
    fourth, fourth_dir, _ = run_task(make_settings, repo, [listing], no_auto)
    assert fourth["status"] == "completed", fourth
    assert json.loads((fourth_dir / "state.json").read_text())["environment"]["outcome"] == "none"
    assert "No such file or directory" in bash_outputs(fourth_dir)[0]  # nothing of any environment is left
    assert fourth.get("unchanged") is True  # and nothing of it was committed


def test_a_failing_setup_is_told_to_the_agent_and_the_task_completes(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    repo = repo_with_setup(
        tmp_path / "repo", "echo resolving dependencies\necho 'no matching distribution' >&2\nexit 3\n"
    )
    outcome, directory, requests = run_task(make_settings, repo, ["echo working anyway"])
    assert outcome["status"] == "completed", outcome
    record = setup_record(directory)
    assert record["status"] == "error"
    assert record["result"]["outcome"] == "failed"
    assert record["result"]["exit_code"] == 3
    told = first_user_message(directory)
    assert "setup (declared by .tasuki/setup.sh) failed: exit code 3" in told
    assert "no matching distribution" in told  # the log's tail
    assert "no matching distribution" in json.dumps(requests[0]["body"]["messages"])  # the model got it
    state = json.loads((directory / "state.json").read_text())
    assert state["environment"]["line"].startswith("setup failed: exit code 3")


def test_a_setup_past_its_deadline_is_killed_and_the_task_goes_on(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    repo = repo_with_setup(tmp_path / "repo", "echo starting the long install\nsleep 600\n")
    outcome, directory, _ = run_task(
        make_settings, repo, ["echo working"], {"TASUKI__ENVIRONMENTS__SETUP_TIMEOUT_S": "2"}
    )
    assert outcome["status"] == "completed", outcome
    record = setup_record(directory)
    assert record["result"]["timed_out"] is True
    assert "timed out after" in first_user_message(directory)
    assert "starting the long install" in first_user_message(directory)


def test_a_setup_secret_reaches_the_setup_masked_and_never_the_agent(
    tmp_path: Path, make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REGISTRY_AUTH", SECRET)
    repo = repo_with_setup(
        tmp_path / "repo",
        'test -n "$REGISTRY_AUTH"\necho "logging in with $REGISTRY_AUTH"\n'
        'echo "$REGISTRY_AUTH" > "$HOME/.registryrc"\n',
    )
    outcome, directory, _ = run_task(
        make_settings,
        repo,
        ['echo "agent sees ${REGISTRY_AUTH:-nothing}"; cat ~/.registryrc | wc -c'],
        {"TASUKI__ENVIRONMENTS__SETUP_SECRETS": '["REGISTRY_AUTH"]'},
    )
    assert outcome["status"] == "completed", outcome
    record = setup_record(directory)
    assert record["result"]["outcome"] == "built"  # it ran with the secret (test -n under bash -e)
    assert "logging in with ***" in record["result"]["log_tail"]
    assert "agent sees nothing" in bash_outputs(directory)[0]
    assert f"{len(SECRET) + 1}\n" in bash_outputs(directory)[0]  # the agent's home is the one the setup wrote in
    assert "REGISTRY_AUTH" in record["result"]["snapshot"]  # not kept: its value is in a file (named)
    assert ".registryrc" in record["result"]["snapshot"]
    for name in ("tools.jsonl", "messages.jsonl", "state.json"):
        assert SECRET not in (directory / name).read_text()


def test_a_setup_with_the_allow_list_installs_through_its_own_proxy(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    # 127.0.1.1: a loopback address not in NO_PROXY, so pip's requests go through the setup's egress proxy.
    with package_index(host=INDEX_HOST) as served:
        served.add(make_wheel(tmp_path / "wheels", "tinypkg", "1.0", {"tinypkg/__init__.py": "VALUE = 42\n"}))
        repo = repo_with_setup(
            tmp_path / "repo", venv_setup(served.url) + "curl -sS -o /dev/null https://example.org 2>&1 || true\n"
        )
        allowed = {
            "TASUKI__ENVIRONMENTS__SETUP_NETWORK": "allowlist",
            "TASUKI__SANDBOX__ALLOWED_HOSTS": '["127.0.1.1"]',
        }
        outcome, directory, _ = run_task(make_settings, repo, [IMPORT], allowed)
    assert outcome["status"] == "completed", outcome
    record = setup_record(directory)
    assert record["result"]["outcome"] == "built", record["result"]["log_tail"]
    assert "403" in record["result"]["log_tail"]  # a host not on the list: the proxy refused the tunnel
    assert "tinypkg says 42" in bash_outputs(directory)[0]
