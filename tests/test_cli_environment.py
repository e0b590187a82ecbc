"""The CLI shows a task's environment (issue 41): `tasuki submit --wait` and `tasuki context show` say where it was
declared, whether it was built, restored, reused or failed (a failed setup's last lines), and how long it took; a
local repository is its resolved real path (two spellings share one environment) and may be bare.

Real subprocesses: the `tasuki` CLI, a real celery worker, real bubblewrap, real git, the replay model over HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from sandbox.settings import EnvironmentsSettings, RepositoryEnvironment
from tests.helpers.ci import bubblewrap_here
from tests.helpers.model_server import model_server
from tests.helpers.stack import Stack, fix_calc_trajectory, git, make_buggy_repo
from tests.test_cli_run import cli_env, tasuki

SETUP = "mkdir -p .deps\necho ready > .deps/marker\necho setup made .deps\n"
FAILING_SETUP = "echo resolving packages\necho 'ERR! could not resolve tinypkg@9'\nexit 3\n"


@pytest.fixture
def stack(tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> Iterator[Stack]:
    bubblewrap_here()  # snapshots need the bubblewrap backend
    with model_server(fix_calc_trajectory()) as server:
        s = Stack(tmp_path, redis_url, server.url)
        try:
            yield s
        finally:
            s.stop()


def repo_with_setup(path: Path, script: str) -> Path:
    repo = make_buggy_repo(path)
    (repo / ".tasuki").mkdir()
    (repo / ".tasuki" / "setup.sh").write_text(script)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "setup")
    return repo


def submit(stack: Stack, repo: str, prompt: str, cwd: Path) -> tuple[str, list[str]]:
    done = tasuki(["submit", "--repo-path", repo, "--prompt", prompt, "--wait"], stack.env(), cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    return lines[0].strip(), lines


def environment_of(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("environment ")]


def test_two_spellings_of_one_repository_share_its_environment_and_the_cli_shows_how_it_came(
    stack: Stack, tmp_path: Path
) -> None:
    repo = repo_with_setup(tmp_path / "repo", SETUP)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "link").symlink_to(repo)  # a third spelling: a relative path through a symbolic link
    stack.start_worker("w1")

    first, first_lines = submit(stack, str(repo), "Make the tests pass.", tmp_path)
    second, second_lines = submit(stack, "../link", "Make the tests pass, please.", elsewhere)

    built = environment_of(first_lines)
    assert built[0] == "environment  setting up (declared by .tasuki/setup.sh)" or built[0].startswith(
        "environment  built in"), first_lines
    assert built[-1].startswith("environment  built in")
    assert built[-1].endswith("(declared by .tasuki/setup.sh)")
    (again,) = environment_of(second_lines)[-1:]
    assert again.startswith(("environment  restored in", "environment  reused in")), second_lines
    branch = git(repo, "branch", "--list", f"tasuki/p*-{second[:8]}").strip()
    assert f"branch: {branch} in {repo}" in second_lines  # the real path, whatever was typed

    shown = tasuki(["context", "show", second], stack.env(), tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert f"Repository: {repo} (local)" in shown.stdout.splitlines()
    (environment,) = [line for line in shown.stdout.splitlines() if line.startswith("Environment:")]
    assert " (declared by .tasuki/setup.sh) at " in environment
    assert environment.startswith(("Environment: restored in", "Environment: reused in"))
    first_shown = tasuki(["context", "show", first], stack.env(), tmp_path).stdout
    assert "Environment: built in" in first_shown


def test_a_failed_setup_is_shown_with_its_last_lines_and_the_task_goes_on(stack: Stack, tmp_path: Path) -> None:
    repo = repo_with_setup(tmp_path / "repo", FAILING_SETUP)
    stack.start_worker("w1")

    uuid, lines = submit(stack, str(repo), "Make the tests pass.", tmp_path)

    failed = next(line for line in lines if "setup failed" in line)
    assert failed.startswith("environment  setup failed: exit code 3 after ")
    assert failed.endswith("(declared by .tasuki/setup.sh); the task goes on without it")
    assert "             | ERR! could not resolve tinypkg@9" in lines
    assert "             | resolving packages" in lines
    assert any(line.startswith("completed") for line in lines)

    shown = tasuki(["context", "show", uuid], stack.env(), tmp_path).stdout.splitlines()
    assert any(line.startswith("Environment: setup failed: exit code 3") for line in shown), shown
    assert "    | ERR! could not resolve tinypkg@9" in shown


def test_a_bare_repository_works_end_to_end(stack: Stack, tmp_path: Path) -> None:
    source = make_buggy_repo(tmp_path / "source")
    bare = tmp_path / "calc.git"
    git(tmp_path, "clone", "-q", "--bare", str(source), str(bare))
    stack.start_worker("w1")

    uuid, lines = submit(stack, "calc.git", "Make the tests pass.", tmp_path)

    branch = git(bare, "branch", "--list", f"tasuki/p*-{uuid[:8]}").strip()
    assert branch, lines  # the task's branch was pushed into the bare repository
    assert lines[-1] == f"branch: {branch} in {bare}"
    assert "return a + b" in git(bare, "show", f"{branch}:calc.py")


def test_a_directory_that_is_no_repository_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "plain" / "objects").mkdir(parents=True)  # half a bare layout: no HEAD, no refs
    done = tasuki(["submit", "--repo-path", "plain", "--prompt", "x"], cli_env(tmp_path), tmp_path)
    assert done.returncode != 0
    (said,) = done.stderr.strip().splitlines()  # one line, no traceback
    assert said.endswith(f"--repo-path {tmp_path / 'plain'} is not a git repository"), said


def test_the_operators_setup_keyed_by_any_spelling_applies_to_the_resolved_path(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (tmp_path / "link").symlink_to(repo)
    entry = RepositoryEnvironment(setup="true")
    by_link = EnvironmentsSettings(repositories={str(tmp_path / "link"): entry})
    by_path = EnvironmentsSettings(repositories={str(repo): entry})

    assert by_link.for_repository(str(repo.resolve())) == entry
    assert by_path.for_repository(str(repo.resolve())) == entry
    assert by_link.for_repository(str(tmp_path / "other")) is None
    assert by_link.for_repository("owner/repo") is None
    assert json.dumps(by_link.model_dump(mode="json"))  # the settings stay plain data
