"""Models chosen per task (issue 37): which profile a task gets (the request's, the task it follows, its repository's,
the default), how a label ``coding agent:NAME`` and ``/tasuki model NAME`` name one on every forge, the per-user
settings on top of the chosen profile, and the profiles summaries and memory jobs use."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contexts import ContextStore
from tests.helpers.deliveries import gitea_labeled, load_payload
from webhooks.events import Command, Ignore, Trigger, github_action, gitlab_action, label_profile
from webhooks.followups import new_task_request
from webhooks.gitea_events import gitea_action
from worker.profiles import UnknownProfile, check_profile, choose_profile, previous_profile
from worker.settings_models import GiteaSettings, GitHubSettings, GitLabSettings, LabelSettings, Settings
from worker.tasks import summary_config
from worker.user_config import resolve_llm_config

KEY = {"task_source": "github", "owner": "acme", "repo": "api", "task_type": "issue", "task_id": "7"}
PROFILES = {
    "TASUKI__LLM__MODELS": json.dumps({
        "claude": {"provider": "openai", "model": "claude-sonnet-4-5", "context_length": 200000},
        "cheap": {"provider": "openai", "model": "gpt-5-mini", "context_length": 64000},
        "local": {"provider": "ollama", "model": "qwen3:8b", "context_length": 16384,
                  "base_url": "http://gpu.internal:11434"},
    }),
    "TASUKI__LLM__REPOSITORIES": json.dumps({"acme/api": "claude", "github/acme/web": "local"}),
}


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(PROFILES)


def test_the_request_wins_then_the_previous_task_then_the_repository_then_the_default(settings: Settings) -> None:
    assert choose_profile(settings, "cheap", "local", KEY) == "cheap"
    assert choose_profile(settings, None, "local", KEY) == "local"
    assert choose_profile(settings, None, None, KEY) == "claude"  # llm.repositories by owner/name
    assert choose_profile(settings, None, None, {**KEY, "repo": "web"}) == "local"  # by source/owner/name
    assert choose_profile(settings, None, None, {**KEY, "repo": "docs"}) is None  # llm.default decides
    # A name the configuration no longer has is passed over, never a failure at the worker.
    assert choose_profile(settings, "gone", "also-gone", KEY) == "claude"


def test_an_unknown_name_is_one_line_naming_the_configured_ones(settings: Settings) -> None:
    assert check_profile(settings, "openai") == "openai"  # the built-in profile stays choosable
    with pytest.raises(UnknownProfile) as caught:
        check_profile(settings, "gpt-9")
    assert str(caught.value) == "no model profile 'gpt-9': the configured ones are cheap, claude, local, openai"


def test_a_follow_up_finds_the_profile_its_previous_task_ran_with(settings: Settings, tmp_path: Path) -> None:
    store = ContextStore(tmp_path / "contexts", fsync="never")
    ctx = store.create(KEY, {"profile": "cheap", "llm_provider": "openai", "model": "gpt-5-mini",
                             "context_length": 64000}, heartbeat=False)
    ctx.finish("completed")
    assert previous_profile(lambda: store, ctx.uuid) == "cheap"
    assert previous_profile(lambda: store, "0b7a4c0e-6a43-4d1e-9a5f-2f7b0f1c9d11") is None  # not on this host
    assert previous_profile(lambda: store, None) is None


@pytest.mark.parametrize(("label", "profile"), [("coding agent:cheap", "cheap"), ("coding agent", None),
                                                ("coding agent: claude ", "claude"), ("coding agent:", None),
                                                ("bug:cheap", None)])
def test_the_trigger_label_followed_by_a_name_names_a_profile(label: str, profile: str | None) -> None:
    assert label_profile(label, "coding agent") == profile


def test_github_gitlab_and_gitea_labels_name_the_profile() -> None:
    payload = load_payload("github/issues.labeled.json")
    payload["label"]["name"] = "coding agent:cheap"
    action = github_action("issues", payload, GitHubSettings())
    assert isinstance(action, Trigger)
    assert action.profile == "cheap"
    assert new_task_request(action)["config"] == {"profile": "cheap"}
    payload["label"]["name"] = "coding agent"
    plain = github_action("issues", payload, GitHubSettings())
    assert isinstance(plain, Trigger)
    assert plain.profile is None
    assert "config" not in new_task_request(plain)
    payload["label"]["name"] = "coding agent done"
    assert isinstance(github_action("issues", payload, GitHubSettings()), Ignore)

    gitlab = load_payload("gitlab/issue_hook.json")
    gitlab["changes"]["labels"]["current"].append({"title": "Platform:local"})
    action = gitlab_action(gitlab, GitLabSettings(labels=LabelSettings(trigger="Platform", processing="API")))
    assert isinstance(action, Trigger)
    assert action.profile == "local"

    action = gitea_action("issues", gitea_labeled(["coding agent:claude"]), GiteaSettings())
    assert isinstance(action, Trigger)
    assert action.profile == "claude"


def test_the_model_command_starts_work_with_the_profile_and_the_other_lines_as_its_prompt() -> None:
    payload = load_payload("github/issue_comment.created.json")
    payload["comment"]["body"] = "> @tasuki fix it\nFix the README typo too.\n/tasuki model Claude\n"
    action = github_action("issue_comment", payload, GitHubSettings(allowed_associations=["OWNER", "NONE"]))
    assert isinstance(action, Trigger)
    assert (action.profile, action.prompt, action.trigger["kind"]) == ("Claude", "Fix the README typo too.",
                                                                       "comment")
    payload["comment"]["body"] = "/tasuki model"
    bare = github_action("issue_comment", payload, GitHubSettings(allowed_associations=["OWNER", "NONE"]))
    assert isinstance(bare, Command)
    assert not bare.known


def test_user_settings_apply_on_top_of_the_chosen_profile(make_settings: Callable[..., Settings],
                                                          fake_redis: Any) -> None:
    answers = {"ann": {"model": "gpt-5", "context_length": 100000, "llm": {"models": {
        "cheap": {"api_key_env": "GITHUB_TOKEN", "temperature": 0.1}}}}}
    settings = make_settings({**PROFILES, "TASUKI__USER_CONFIG_API__URL": "http://users.invalid"})

    def fetch(url: str) -> Any:
        return answers[url.rsplit("/", 1)[-1]]

    config = resolve_llm_config(settings, fake_redis, "ann", fetch, profile="cheap")
    assert config == {"profile": "cheap", "llm_provider": "openai", "model": "gpt-5", "context_length": 100000,
                      "compression_threshold": 0.7, "endpoint": None, "user_config": "api"}
    # Which variable holds a key is never a user's to say: the operator's profile keeps its own.
    assert fake_redis.get("tasuki:user-config:ann:cheap") is not None
    no_user = resolve_llm_config(settings, fake_redis, None, fetch, profile="local")
    assert (no_user["profile"], no_user["model"], no_user["endpoint"]) == ("local", "qwen3:8b",
                                                                          "http://gpu.internal:11434")


def test_user_settings_cannot_name_the_key_variable_of_a_profile(make_settings: Callable[..., Settings]) -> None:
    from worker.user_config import apply_overrides

    settings = make_settings(PROFILES)
    changed = apply_overrides(settings, {"llm": {"models": {"cheap": {"api_key_env": "GITHUB_TOKEN",
                                                                      "temperature": 0.1}}}}, "cheap")
    assert changed.llm.models["cheap"].api_key_env is None
    assert changed.llm.models["cheap"].temperature == 0.1


def test_summaries_use_the_summarizer_profile_when_one_is_set(make_settings: Callable[..., Settings]) -> None:
    task = {"profile": "claude", "llm_provider": "openai", "model": "claude-sonnet-4-5", "context_length": 200000}
    assert summary_config(make_settings(PROFILES), task) is task
    summarizer = summary_config(make_settings({**PROFILES, "TASUKI__LLM__SUMMARIZER": "cheap"}), task)
    assert (summarizer["profile"], summarizer["model"], summarizer["context_length"]) == ("cheap", "gpt-5-mini",
                                                                                          64000)


def test_submit_with_an_unknown_model_is_one_line_and_queues_nothing(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from tests.helpers.cli_process import one_line_error
    from tests.helpers.stack import make_buggy_repo

    repo = make_buggy_repo(tmp_path / "repo")
    (tmp_path / "config.yaml").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASUKI")}
    env.update({"TASUKI_CONFIG": str(tmp_path / "config.yaml"), "TASUKI__LLM__MODELS": PROFILES["TASUKI__LLM__MODELS"],
                # nothing answers here: an unknown name must be refused before anything is sent
                "TASUKI__BROKER__URL": "redis://127.0.0.1:1/0"})
    result = subprocess.run([sys.executable, "-m", "cli.main", "submit", "--repo-path", str(repo), "--prompt", "p",
                             "--model", "gpt-9"], capture_output=True, text=True, env=env, timeout=60, check=False,
                            cwd=Path(__file__).resolve().parents[1])
    assert one_line_error(result, 2) == ("tasuki: error: no model profile 'gpt-9': the configured ones are cheap, "
                                         "claude, local, openai")
