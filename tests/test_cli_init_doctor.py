"""``tasuki init`` and ``tasuki doctor`` through the real CLI, against the replay model, the fake forge and real
Redis and bubblewrap: each part broken in turn FAILs with its fix, and init end to end writes what it said."""

from __future__ import annotations

import os
import pty
import select
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.helpers.fake_forge import FakeForge
from tests.helpers.model_server import model_server

TOOL_TURN = {"content": None, "tool_calls": [{"name": "finish", "arguments": {"summary": "ok"}}]}
TEXT_TURN = {"content": "I cannot call tools.", "tool_calls": []}
# What Qwen2.5-Coder-1.5B on llama-server answers: the call written in its text, which tasks read (textcalls.py)
WRITTEN_TURN = {"content": '```json\n{"name": "finish", "arguments": {"summary": "ok"}}\n```', "tool_calls": []}


def tasuki_command() -> list[str]:
    script = Path(sys.executable).parent / "tasuki"
    return [str(script)] if script.exists() else [sys.executable, "-m", "cli.main"]


def run(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd)}
    return subprocess.run([*tasuki_command(), *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          check=False, env={**base, **(env or {})})


@pytest.fixture
def forge(tmp_path: Path) -> Iterator[FakeForge]:
    with FakeForge(tmp_path / "forge", token="good-token").serve() as served:
        yield served


def write_config(directory: Path, base_url: str, broker: str, *, extra: str = "") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.yaml"
    path.write_text(
        f"broker:\n  url: {broker}\n"
        f"llm:\n  default: main\n  models:\n    main:\n      provider: openai\n      model: replay\n"
        f"      base_url: {base_url}\n" + extra,
        encoding="utf-8",
    )
    return path


def lines_of(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """The doctor's lines by part."""
    found = {}
    for line in result.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("OK", "FAIL"):
            found[rest.split(":", 1)[0]] = line
    return found


def test_doctor_all_ok_then_each_part_broken_in_turn(tmp_path: Path, redis_url: str, forge: FakeForge) -> None:
    with model_server([TOOL_TURN]) as model:  # a fresh conversation is answered with the first turn
        extra = f"github:\n  api_url: {forge.github_api_url}\n"
        write_config(tmp_path, model.openai_base_url, redis_url, extra=extra)
        env = {"GITHUB_TOKEN": "good-token", "OPENAI_API_KEY": "k"}
        healthy = run(tmp_path, "doctor", env=env)
        parts = lines_of(healthy)
        assert healthy.returncode == 0, healthy.stdout + healthy.stderr
        assert set(parts) >= {"config", "broker", "contexts", "model", "forge github", "sandbox"}
        assert "with a tool call" in parts["model"]

        bad_token = run(tmp_path, "doctor", env={**env, "GITHUB_TOKEN": "wrong"})
        assert bad_token.returncode == 1
        assert lines_of(bad_token)["forge github"].startswith("FAIL forge github:")
        assert "— fix: put a valid token in GITHUB_TOKEN" in lines_of(bad_token)["forge github"]
        assert lines_of(bad_token)["broker"].startswith("OK")

        write_config(tmp_path, model.openai_base_url, "redis://127.0.0.1:1/0", extra=extra)
        bad_redis = run(tmp_path, "doctor", env=env)
        assert bad_redis.returncode == 1
        assert lines_of(bad_redis)["broker"].startswith("FAIL broker: Redis at redis://127.0.0.1:1/0 does not answer")

    with model_server([TEXT_TURN]) as wordy:
        write_config(tmp_path, wordy.openai_base_url, redis_url, extra=extra)
        no_tools = run(tmp_path, "doctor", env=env)
        assert no_tools.returncode == 1
        assert "answered without a tool call" in lines_of(no_tools)["model"]
        assert "fix: choose a model" in lines_of(no_tools)["model"]

    with model_server([WRITTEN_TURN]) as small:
        write_config(tmp_path, small.openai_base_url, redis_url, extra=extra)
        written = run(tmp_path, "doctor", env=env)
        assert written.returncode == 0, written.stdout + written.stderr
        assert "answered with a tool call written in its text (finish)" in lines_of(written)["model"]

    unreachable = run(tmp_path, "doctor", env=env)  # the replay server is gone: nothing listens there
    assert unreachable.returncode == 1
    assert lines_of(unreachable)["model"].startswith("FAIL model: main (openai replay at ")
    assert "did not answer" in lines_of(unreachable)["model"]


def test_doctor_fails_an_unwritable_contexts_dir(tmp_path: Path, redis_url: str) -> None:
    # A file where the directory should be: no user, root included, can make the store there.
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    with model_server([TOOL_TURN]) as model:
        write_config(tmp_path, model.openai_base_url, redis_url,
                     extra=f"contexts:\n  base_dir: {blocker / 'contexts'}\n")
        result = run(tmp_path, "doctor")
    assert result.returncode == 1
    line = lines_of(result)["contexts"]
    assert line.startswith(f"FAIL contexts: {blocker / 'contexts'} is not writable"), line
    assert "— fix: make" in line
    assert lines_of(result)["model"].startswith("OK model")


def test_init_with_flags_against_fake_github_and_gitlab(tmp_path: Path, redis_url: str, forge: FakeForge) -> None:
    for name, api in (("github", forge.github_api_url), ("gitlab", forge.gitlab_api_url)):
        target = tmp_path / name
        with model_server([TOOL_TURN, TOOL_TURN]) as model:
            token_env = f"{name.upper()}_TOKEN"
            result = run(tmp_path, "init", "--yes", "--forge", name, "--api-url", api, "--model-provider", "openai",
                         "--model", "replay", "--base-url", model.openai_base_url, "--api-key-env", "REPLAY_KEY",
                         "--network", "none", "--broker", redis_url, "--store", "none",
                         "--webhook-url", "https://tasuki.example.org", "--dir", str(target),
                         env={token_env: "good-token", "REPLAY_KEY": "sk-secret-1"})
        assert result.returncode == 0, result.stdout + result.stderr
        assert "model check: OK model: main (openai replay" in result.stdout
        assert f"webhook URL to paste into {name}: https://tasuki.example.org/webhooks/{name}" in result.stdout
        assert f"OK forge {name}:" in result.stdout
        config_text = (target / "config.yaml").read_text()
        assert "good-token" not in config_text
        assert "sk-secret-1" not in config_text
        config = yaml.safe_load(config_text)
        assert config["llm"]["models"]["main"]["api_key_env"] == "REPLAY_KEY"
        assert config["sandbox"] == {"network": "none"}
        assert config[name]["api_url"] == api
        env_file = target / "tasuki.env"
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
        secrets = env_file.read_text()
        assert f"{token_env}='good-token'" in secrets
        assert "REPLAY_KEY='sk-secret-1'" in secrets
        printed_secret = result.stdout.split("webhook secret")[1].split(": ", 1)[1].split()[0]
        assert f"{name.upper()}_WEBHOOK_SECRET='{printed_secret}'" in secrets
        # The written files are what a later doctor reads: the env file sourced, as the tutorial says.
        sourced = dict(line.split("=", 1) for line in secrets.splitlines() if "=" in line and line[0] != "#")
        with model_server([TOOL_TURN]) as model2:
            text = config_text.replace(config["llm"]["models"]["main"]["base_url"], model2.openai_base_url)
            (target / "config.yaml").write_text(text)
            again = run(target, "doctor", env={k: v.strip("'") for k, v in sourced.items()})
        assert again.returncode == 0, again.stdout


def test_init_in_a_pseudo_terminal_answers_the_prompts(tmp_path: Path, redis_url: str, forge: FakeForge) -> None:
    answers = {
        "Forge": "gitlab", "gitlab API root": forge.gitlab_api_url, "Model provider": "openai", "Model (": "replay",
        "Model base URL": None, "Environment variable of the API key": "", "Sandbox network": "allowlist",
        "Broker": redis_url, "Fleet store": "none", "Public URL": "https://ci.example.org", "OPENAI_API_KEY": "sk-x",
        "GITLAB_TOKEN": "good-token",
    }
    with model_server([TOOL_TURN, TOOL_TURN]) as model:
        answers["Model base URL"] = model.openai_base_url
        pid, fd = pty.fork()
        if pid == 0:  # the child: the real CLI on the terminal
            os.chdir(tmp_path)
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
            os.execve(tasuki_command()[0] if len(tasuki_command()) == 1 else sys.executable,  # noqa: S606
                      [*tasuki_command(), "init", "--dir", str(tmp_path / "cfg")], env)
        transcript = b""
        pending = list(answers.items())
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            transcript += chunk
            tail = transcript.decode(errors="replace").rsplit("\n", 1)[-1]
            if pending and tail.rstrip().endswith(":") and pending[0][0] in tail:
                os.write(fd, (str(pending.pop(0)[1]) + "\n").encode())
        else:
            os.kill(pid, 9)  # the prompts went on past the deadline: stop the child, fail below
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    text = transcript.decode(errors="replace")
    assert not pending, text
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert "webhook URL to paste into gitlab: https://ci.example.org/webhooks/gitlab" in text
    assert "OK forge gitlab:" in text
    assert "OK model: main (openai replay" in text
    config = yaml.safe_load((tmp_path / "cfg" / "config.yaml").read_text())
    assert config["sandbox"]["network"] == "allowlist"
    assert "GITLAB_TOKEN='good-token'" in (tmp_path / "cfg" / "tasuki.env").read_text()


def test_init_replaces_a_config_that_only_restates_the_defaults_and_keeps_one_with_choices(
    tmp_path: Path, redis_url: str, forge: FakeForge
) -> None:
    # A fresh clone ships the reference config.yaml (every value the built-in default): the tutorial's first
    # `init` replaces it without --force, since nothing is lost; a file that chooses anything is kept.
    reference = Path(__file__).resolve().parents[1] / "config.yaml"
    fresh, chosen = tmp_path / "fresh", tmp_path / "chosen"
    for directory in (fresh, chosen):
        directory.mkdir()
        (directory / "config.yaml").write_text(reference.read_text(encoding="utf-8"), encoding="utf-8")
    mine = (chosen / "config.yaml").read_text(encoding="utf-8").replace("max_steps: 100 ", "max_steps: 7   ", 1)
    assert mine != reference.read_text(encoding="utf-8")
    (chosen / "config.yaml").write_text(mine, encoding="utf-8")
    flags = ["--yes", "--forge", "github", "--api-url", forge.github_api_url, "--model-provider", "openai",
             "--model", "replay", "--api-key-env", "REPLAY_KEY", "--network", "none", "--broker", redis_url,
             "--store", "none", "--webhook-url", "https://tasuki.example.org"]
    refused = run(tmp_path, "init", *flags, "--base-url", "http://127.0.0.1:9/v1", "--dir", str(chosen),
                  env={"GITHUB_TOKEN": "good-token", "REPLAY_KEY": "k"})
    assert refused.returncode == 2
    assert "chooses settings of its own; pass --force" in refused.stderr
    assert (chosen / "config.yaml").read_text(encoding="utf-8") == mine
    with model_server([TOOL_TURN, TOOL_TURN]) as model:
        done = run(tmp_path, "init", *flags, "--base-url", model.openai_base_url, "--dir", str(fresh),
                   env={"GITHUB_TOKEN": "good-token", "REPLAY_KEY": "k"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert yaml.safe_load((fresh / "config.yaml").read_text())["sandbox"] == {"network": "none"}


def test_doctor_from_another_directory_reads_the_secrets_init_wrote_and_the_environment_wins(
    tmp_path: Path, redis_url: str, forge: FakeForge
) -> None:
    """No `source`: the commands load the tasuki.env beside their config.yaml, as docker compose treats .env."""
    target, elsewhere = tmp_path / "cfg", tmp_path / "elsewhere"
    elsewhere.mkdir()
    with model_server([TOOL_TURN] * 5) as model:
        made = run(tmp_path, "init", "--yes", "--forge", "github", "--api-url", forge.github_api_url,
                   "--model-provider", "openai", "--model", "replay", "--base-url", model.openai_base_url,
                   "--api-key-env", "REPLAY_KEY", "--network", "none", "--broker", redis_url, "--dir", str(target),
                   env={"GITHUB_TOKEN": "good-token", "REPLAY_KEY": "sk-secret-1"})
        assert made.returncode == 0, made.stdout + made.stderr
        env_file, chosen = target / "tasuki.env", {"TASUKI_CONFIG": str(target / "config.yaml")}

        healthy = run(elsewhere, "doctor", env=chosen)
        assert healthy.returncode == 0, healthy.stdout + healthy.stderr
        assert lines_of(healthy)["forge github"].startswith("OK forge github:")  # the file's token reached it
        assert lines_of(healthy)["config"] == (
            f"OK config: configuration {target / 'config.yaml'}, secrets {env_file} "
            "(REPLAY_KEY, GITHUB_TOKEN, GITHUB_WEBHOOK_SECRET)"
        )
        assert "good-token" not in healthy.stdout + healthy.stderr
        assert "sk-secret-1" not in healthy.stdout + healthy.stderr

        overridden = run(elsewhere, "doctor", env={**chosen, "GITHUB_TOKEN": "wrong"})
        assert overridden.returncode == 1
        assert lines_of(overridden)["forge github"].startswith("FAIL forge github:")
        assert lines_of(overridden)["config"].endswith("(REPLAY_KEY, GITHUB_WEBHOOK_SECRET; the environment's "
                                                       "GITHUB_TOKEN)")

    env_file.chmod(0o644)
    refused = run(elsewhere, "doctor", env=chosen)
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert refused.stderr.splitlines() == [
        f"tasuki: error: {env_file} may be read or changed by others (mode 0644); fix: chmod 600 {env_file}"
    ]
