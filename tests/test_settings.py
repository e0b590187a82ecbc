"""The settings loader: defaults < config.yaml < TASUKI__ environment; one clear line per bad key."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from contexts.masking import mask
from worker.settings import ConfigError, ConfigSource, LLMProfile, Settings, load_settings, resolve_paths

ROOT = Path(__file__).resolve().parent.parent


def defaults_under(root: Path, file: Path | None = None) -> Settings:
    """The model's defaults with their relative paths under ``root`` (the data directory), as the loader resolves
    them."""
    plain = Settings()
    settings = plain.model_copy(update={"local": plain.local.model_copy(update={"data_dir": root})})
    return resolve_paths(settings, root, env_root=root, from_env=set()).with_source(ConfigSource(file, root))


def write_config(tmp_path: Path, text: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def config_error(config: str | None, env: dict[str, str], tmp_path: Path) -> str:
    path = write_config(tmp_path, config) if config is not None else None
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env=env)
    return str(caught.value)


def leaf_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    paths: set[tuple[str, ...]] = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            paths |= leaf_paths(annotation, (*prefix, name))
        else:
            paths.add((*prefix, name))
    return paths


def yaml_leaf_paths(data: dict[str, Any], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    paths: set[tuple[str, ...]] = set()
    for key, value in data.items():
        if isinstance(value, dict) and value:  # an empty mapping is a leaf key's value (pricing: {})
            paths |= yaml_leaf_paths(value, (*prefix, key))
        else:
            paths.add((*prefix, key))
    return paths


# --- config.yaml and the models cannot drift apart ---------------------------------------------------


def test_repository_config_yaml_loads_to_exactly_the_model_defaults() -> None:
    assert load_settings(ROOT / "config.yaml", env={}) == defaults_under(ROOT, ROOT / "config.yaml")


def test_repository_config_yaml_names_every_key_and_comments_each_one() -> None:
    text = (ROOT / "config.yaml").read_text()
    assert yaml_leaf_paths(yaml.safe_load(text)) == leaf_paths(Settings)
    for line in text.splitlines():
        stripped = line.strip()
        is_leaf = ":" in stripped and not stripped.startswith("#") and not stripped.endswith(":")
        assert not is_leaf or "  # " in line, f"config.yaml key without a comment: {line!r}"


def test_every_key_documents_itself_with_an_attribute_docstring() -> None:
    def undocumented(model: type[BaseModel], prefix: str = "") -> list[str]:
        missing = []
        for name, field in model.model_fields.items():
            if not field.description:
                missing.append(prefix + name)
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
                missing += undocumented(field.annotation, f"{prefix}{name}.")
        return missing

    assert undocumented(Settings) == []


def test_defaults_are_the_ones_spec_section_9_names() -> None:
    s = Settings()
    assert s.broker.url == "redis://localhost:6379/0"
    assert s.broker.visibility_timeout_s == 21600
    assert (s.contexts.base_dir, s.contexts.fsync) == (Path("logs/contexts"), "step")
    assert s.contexts.retention.delete_after_days == 30
    assert s.llm.provider == "openai"
    assert (s.llm.ollama.model, s.llm.ollama.context_length) == ("qwen3:30b", 32768)
    assert (s.compression.warn_at, s.compression.threshold) == (0.6, 0.7)
    assert s.agent.time_limit_s == 14400
    assert s.github.allowed_associations == ("OWNER", "MEMBER", "COLLABORATOR")
    assert s.gitlab.labels.processing == "coding agent processing"
    assert s.user_config_api.url is None


# --- sources and their order ---------------------------------------------------------------------------


def test_a_partial_config_file_overrides_its_keys_and_keeps_every_other_default(tmp_path: Path) -> None:
    path = write_config(tmp_path, "agent:\n  max_steps: 7\nllm:\n  ollama: {model: 'llama3:8b'}\n")
    s = load_settings(path, env={})
    assert s.agent.max_steps == 7
    assert s.agent.time_limit_s == 14400
    assert s.llm.ollama.model == "llama3:8b"
    assert s.llm.ollama.host == "http://localhost:11434"


def test_environment_overrides_config_file(tmp_path: Path) -> None:
    path = write_config(tmp_path, "monitor: {interval_s: 5, max_attempts: 2}\n")
    s = load_settings(path, env={"TASUKI__MONITOR__INTERVAL_S": "9"})
    assert (s.monitor.interval_s, s.monitor.max_attempts) == (9, 2)


def test_spec_examples_point_openai_at_a_local_server_and_rename_the_trigger_label() -> None:
    s = load_settings(
        env={"TASUKI__LLM__OPENAI__BASE_URL": "http://127.0.0.1:8000/v1", "TASUKI__GITHUB__LABELS__TRIGGER": "bug"}
    )
    assert s.llm.openai.base_url == "http://127.0.0.1:8000/v1"
    assert s.github.labels.trigger == "bug"
    assert s.github.labels.done == "coding agent done"


def test_environment_names_are_case_insensitive() -> None:
    s = load_settings(env={"tasuki__Contexts__FSYNC": "always"})
    assert s.contexts.fsync == "always"


def test_environment_lists_and_sections_are_json() -> None:
    s = load_settings(
        env={
            "TASUKI__GITHUB__ALLOWED_ASSOCIATIONS": '["OWNER", "CONTRIBUTOR"]',
            "TASUKI__GITLAB__LABELS": '{"trigger": "agent", "done": "agent done"}',
            "TASUKI__GITLAB__LABELS__DONE": "finished",
        }
    )
    assert s.github.allowed_associations == ("OWNER", "CONTRIBUTOR")
    assert (s.gitlab.labels.trigger, s.gitlab.labels.done) == ("agent", "finished")


def test_environment_null_unsets_an_optional_key(tmp_path: Path) -> None:
    path = write_config(tmp_path, "user_config_api: {url: 'http://users.internal'}\n")
    assert load_settings(path, env={"TASUKI__USER_CONFIG_API__URL": "null"}).user_config_api.url is None


def test_config_path_comes_from_the_argument_then_tasuki_config_then_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.yaml").write_text("agent: {max_steps: 1}\n")
    (tmp_path / "b.yaml").write_text("agent: {max_steps: 2}\n")
    (tmp_path / "config.yaml").write_text("agent: {max_steps: 3}\n")
    monkeypatch.chdir(tmp_path)
    env = {"TASUKI_CONFIG": str(tmp_path / "b.yaml")}
    assert load_settings(tmp_path / "a.yaml", env=env).agent.max_steps == 1
    assert load_settings(env=env).agent.max_steps == 2
    assert load_settings(env={}).agent.max_steps == 3
    (tmp_path / "config.yaml").unlink()
    assert load_settings(env={}) == defaults_under(ROOT)  # no file: beside the checkout, not the working directory


def test_an_explicit_env_mapping_ignores_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASUKI__AGENT__MAX_STEPS", "42")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-process-environment")
    assert load_settings(env={}).agent.max_steps == 100
    assert load_settings(env={}).secrets.openai_api_key is None
    assert load_settings().agent.max_steps == 42


# --- bad configuration: one line per problem, key, value, expectation, origin --------------------------


@pytest.mark.parametrize(
    ("config", "env", "message"),
    [
        (
            "contexts: {fsync: sometimes}",
            {},
            "config: contexts.fsync = 'sometimes': expected one of always, step, never",
        ),
        (
            None,
            {"TASUKI__CONTEXTS__FSYNC": "sometimes"},
            "config: contexts.fsync = 'sometimes' (from TASUKI__CONTEXTS__FSYNC): expected one of always, step, never",
        ),
        ("llm: {provider: anthropic}", {}, "config: llm.provider = 'anthropic': expected one of openai, ollama"),
        ("compression: {threshold: 1.5}", {}, "config: compression.threshold = 1.5: expected less than or equal to 1"),
        ("compression: {warn_at: 0}", {}, "config: compression.warn_at = 0: expected greater than 0"),
        (
            "compression: {warn_at: 0.8, threshold: 0.7}",
            {},
            "config: compression.warn_at = 0.8: at most threshold (0.7)",
        ),
        ("agent: {max_steps: 0}", {}, "config: agent.max_steps = 0: expected greater than 0"),
        (
            None,
            {"TASUKI__AGENT__MAX_STEPS": "many"},
            "config: agent.max_steps = 'many' (from TASUKI__AGENT__MAX_STEPS): "
            "expected a valid integer, unable to parse string as an integer",
        ),
        (
            "broker: {visibility_timeout_s: 3600}",
            {},
            "config: broker.visibility_timeout_s = 3600: more than agent.time_limit_s (14400)",
        ),
        (
            "contexts: {heartbeat_interval_s: 60, stale_after_s: 60}",
            {},
            "config: contexts.heartbeat_interval_s = 60: less than stale_after_s (60)",
        ),
        (
            "llm: {openai: {modle: gpt-4o}}",
            {},
            "config: llm.openai.modle = 'gpt-4o': unknown key (did you mean model?)",
        ),
        (
            None,
            {"TASUKI__GITHUB__LABEL__TRIGGER": "bug"},
            "config: github.label = {'trigger': 'bug'} (from TASUKI__GITHUB__LABEL__TRIGGER): "
            "unknown key (did you mean labels?)",
        ),
        (
            "pricing: {gpt-4o: {inptu: 2.5, cached_input: 1.25, output: 10}}",
            {},
            "config: pricing.gpt-4o.inptu = 2.5: unknown key (did you mean input?)",
        ),
        (
            "pricing: {gpt-4o: {input: 2.5}}",
            {},
            "config: pricing.gpt-4o.output = {'input': 2.5}: missing: this key has no default",
        ),
        (
            None,
            {"TASUKI__LIMITS__TASK_TOKEN": "1000"},
            "config: limits.task_token = '1000' (from TASUKI__LIMITS__TASK_TOKEN): unknown key (did you mean "
            "task_tokens?)",
        ),
        (
            "llm: {provider: ollama}\nlimits: {task_cost: 5}",
            {},
            "config: limits.task_cost = 5.0: a price for a configured model (qwen3:30b) in pricing (no cost can be "
            "counted)",
        ),
        (
            "github: {api_url: api.github.com}",
            {},
            "config: github.api_url = 'api.github.com': expected an http:// or https:// URL",
        ),
        (
            None,
            {"TASUKI__GITHUB__ALLOWED_ASSOCIATIONS": "OWNER,MEMBER"},
            "config: github.allowed_associations = 'OWNER,MEMBER' (from TASUKI__GITHUB__ALLOWED_ASSOCIATIONS): "
            'expected JSON, e.g. ["OWNER", "MEMBER"] or {"key": "value"}',
        ),
    ],
)
def test_a_bad_value_is_reported_with_key_value_and_expectation(
    tmp_path: Path, config: str | None, env: dict[str, str], message: str
) -> None:
    assert config_error(config, env, tmp_path) == message


def test_every_problem_gets_its_own_line(tmp_path: Path) -> None:
    message = config_error(
        "contexts: {fsync: sometimes}\nagent: {max_steps: -1}\nmonitor: {resume: perhaps}\nextra: 1\n",
        {},
        tmp_path,
    )
    lines = message.splitlines()
    assert len(lines) == 4
    assert all(line.startswith("config: ") for line in lines)
    assert {line.split(" = ")[0] for line in lines} == {
        "config: contexts.fsync",
        "config: agent.max_steps",
        "config: monitor.resume",
        "config: extra",
    }


def test_a_missing_tasuki_config_file_is_an_error_naming_the_variable(tmp_path: Path) -> None:
    message = config_error(None, {"TASUKI_CONFIG": str(tmp_path / "nope.yaml")}, tmp_path)
    assert message == f"config: {tmp_path / 'nope.yaml'} (from TASUKI_CONFIG): no such file"


def test_unparsable_yaml_is_an_error_with_its_line(tmp_path: Path) -> None:
    message = config_error("broker:\n  url: [unclosed\n", {}, tmp_path)
    assert message.startswith(f"config: cannot parse {tmp_path / 'config.yaml'} at line ")


def test_a_config_file_that_is_not_a_mapping_is_an_error(tmp_path: Path) -> None:
    message = config_error("- broker\n- llm\n", {}, tmp_path)
    assert message == f"config: {tmp_path / 'config.yaml'}: expected a mapping of sections, found a list"


def test_an_empty_config_file_means_defaults(tmp_path: Path) -> None:
    config = write_config(tmp_path, "# nothing yet\n")
    assert load_settings(config, env={}) == defaults_under(tmp_path, config)


# --- relative paths -------------------------------------------------------------------------------------


def test_relative_paths_in_a_config_file_resolve_against_its_directory_not_the_working_directory(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path / "deploy", "contexts: {base_dir: store, workspaces_dir: ../checkouts}\n")
    s = load_settings(config, env={}, cwd=tmp_path / "elsewhere")
    assert s.contexts.base_dir == tmp_path / "deploy" / "store"
    assert s.contexts.workspaces_dir == tmp_path / "deploy" / ".." / "checkouts"
    assert s.source.file == config
    assert s.source.root == tmp_path / "deploy"


def test_defaults_resolve_against_the_config_files_directory(tmp_path: Path) -> None:
    s = load_settings(write_config(tmp_path, "agent: {max_steps: 3}\n"), env={}, cwd=Path("/"))
    assert s.contexts.base_dir == tmp_path / "logs" / "contexts"


def test_relative_paths_from_the_environment_resolve_against_the_working_directory(tmp_path: Path) -> None:
    config = write_config(tmp_path / "deploy", "")
    s = load_settings(config, env={"TASUKI__CONTEXTS__BASE_DIR": "here"}, cwd=tmp_path / "shell")
    assert s.contexts.base_dir == tmp_path / "shell" / "here"
    assert s.contexts.workspaces_dir == tmp_path / "deploy" / "var" / "workspaces"


def test_without_a_config_file_paths_resolve_beside_the_checkout_never_the_working_directory(tmp_path: Path) -> None:
    s = load_settings(env={}, cwd=tmp_path)
    assert s.local.data_dir == ROOT  # the checkout holding the ./tasuki launcher
    assert s.contexts.base_dir == ROOT / "logs" / "contexts"
    assert s.local.var_dir == ROOT / "var"
    assert s.source.file is None
    assert str(ROOT) in s.source.describe()
    assert "defaults" in s.source.describe()


def test_an_installed_package_keeps_its_files_under_xdg_data_home(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import worker.settings

    monkeypatch.setattr(worker.settings, "CHECKOUT", tmp_path / "site-packages")  # no launcher beside it
    s = load_settings(env={"XDG_DATA_HOME": str(tmp_path / "xdg")}, cwd=tmp_path)
    assert s.local.data_dir == tmp_path / "xdg" / "tasuki"
    assert s.contexts.git_cache_dir == tmp_path / "xdg" / "tasuki" / "var" / "git-cache"
    s = load_settings(env={"HOME": str(tmp_path / "home")}, cwd=tmp_path)
    assert s.local.var_dir == tmp_path / "home" / ".local" / "share" / "tasuki" / "var"


def test_local_data_dir_moves_every_default_path_but_not_the_ones_chosen(tmp_path: Path) -> None:
    config = write_config(tmp_path / "etc", "local: {data_dir: /srv/tasuki}\ncontexts: {base_dir: ctx}\n")
    s = load_settings(config, env={"TASUKI__CONTEXTS__WORKSPACES_DIR": "ws"}, cwd=tmp_path)
    assert s.local.data_dir == Path("/srv/tasuki")
    assert s.local.var_dir == Path("/srv/tasuki/var")
    assert s.contexts.git_cache_dir == Path("/srv/tasuki/var/git-cache")
    assert s.contexts.base_dir == tmp_path / "etc" / "ctx"  # chosen in the file: under the file's directory
    assert s.contexts.workspaces_dir == tmp_path / "ws"  # chosen in the environment: under the working directory
    s = load_settings(env={"TASUKI__LOCAL__DATA_DIR": "data"}, cwd=tmp_path)
    assert s.contexts.base_dir == tmp_path / "data" / "logs" / "contexts"


def test_a_broker_counts_as_configured_only_when_chosen(tmp_path: Path) -> None:
    assert not load_settings(env={}, cwd=tmp_path).source.sets("broker", "url")
    reference = load_settings(ROOT / "config.yaml", env={})  # the default written out is no choice
    assert not reference.source.sets("broker", "url")
    chosen = write_config(tmp_path, "broker: {url: 'redis://127.0.0.1:6380/0'}\n")
    assert load_settings(chosen, env={}).source.sets("broker", "url")
    assert load_settings(env={"TASUKI__BROKER__URL": "redis://localhost:6379/0"}, cwd=tmp_path).source.sets(
        "broker", "url")


def test_a_relative_config_argument_is_taken_from_the_working_directory(tmp_path: Path) -> None:
    write_config(tmp_path / "deploy", "agent: {max_steps: 4}\n")
    s = load_settings("deploy/config.yaml", env={}, cwd=tmp_path)
    assert s.agent.max_steps == 4
    assert s.source.file == tmp_path / "deploy" / "config.yaml"


def test_config_error_survives_pickling_as_celery_needs() -> None:
    error = pickle.loads(pickle.dumps(ConfigError("config: a.b = 1: expected 2")))  # noqa: S301 - our own bytes
    assert isinstance(error, ConfigError)
    assert str(error) == "config: a.b = 1: expected 2"


def test_settings_are_immutable() -> None:
    s = Settings()
    with pytest.raises(ValidationError):
        s.agent.max_steps = 5


# --- secrets -----------------------------------------------------------------------------------------


SECRET_ENV = {
    "OPENAI_API_KEY": "sk-test-0123456789abcdefghij",
    "GITHUB_TOKEN": "ghp_0123456789abcdefghijklmnop",
    "GITLAB_TOKEN": "glpat-0123456789abcdefghij",
    "GITHUB_WEBHOOK_SECRET": "hook-secret-github",
    "GITLAB_WEBHOOK_SECRET": "hook-secret-gitlab",
    "TASUKI_API_TOKEN": "api-token-plain-words",
}


def test_secrets_come_from_unprefixed_environment_variables() -> None:
    secrets = load_settings(env=SECRET_ENV).secrets
    assert secrets.openai_api_key is not None
    assert secrets.openai_api_key.get_secret_value() == SECRET_ENV["OPENAI_API_KEY"]
    assert secrets.tasuki_api_token is not None
    assert secrets.tasuki_api_token.get_secret_value() == SECRET_ENV["TASUKI_API_TOKEN"]
    assert load_settings(env={"GITHUB_TOKEN": ""}).secrets.github_token is None


def test_secrets_never_appear_in_repr_dump_or_public_dump() -> None:
    s = load_settings(env=SECRET_ENV)
    shown = [repr(s), str(s), repr(s.secrets), json.dumps(s.public_dump()), s.model_dump_json()]
    for text in shown:
        for value in SECRET_ENV.values():
            assert value not in text
    assert "secrets" not in s.public_dump()


def test_secrets_cannot_be_set_from_config_file_or_prefixed_environment(tmp_path: Path) -> None:
    assert config_error("secrets: {openai_api_key: sk-x}", {}, tmp_path).startswith("config: secrets = ")
    message = config_error(None, {"TASUKI__SECRETS__OPENAI_API_KEY": "sk-x"}, tmp_path)
    assert message.startswith("config: secrets = ")
    assert "unknown key" in message


def test_loaded_secrets_are_masked_even_when_they_match_no_token_pattern() -> None:
    load_settings(env=SECRET_ENV)
    assert mask("token is api-token-plain-words.") == "token is [SECRET]."


def test_public_dump_hides_credentials_inside_urls() -> None:
    s = load_settings(env={"TASUKI__BROKER__URL": "redis://tasuki:hunter2hunter2@redis:6379/0"})
    assert "hunter2hunter2" not in json.dumps(s.public_dump())
    assert s.public_dump()["broker"]["visibility_timeout_s"] == 21600


# --- helpers for the rest of the code -------------------------------------------------------------------


def test_llm_profile_describes_the_selected_provider() -> None:
    assert load_settings(env={}).llm_profile()[:5] == ("openai", "openai", "gpt-4o", 128000, None)
    ollama = load_settings(env={"TASUKI__LLM__PROVIDER": "ollama", "TASUKI__LLM__OLLAMA__HOST": "http://gpu:11434"})
    assert ollama.llm_profile()[:5] == ("ollama", "ollama", "qwen3:30b", 32768, "http://gpu:11434")


def test_model_profiles_are_chosen_by_name_and_checked(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "llm:\n"
        "  default: claude\n"
        "  summarizer: cheap\n"
        "  models:\n"
        "    claude: {provider: openai, model: big, context_length: 200000, fallbacks: [cheap]}\n"
        "    cheap: {provider: ollama, model: small, context_length: 8192, temperature: 0.2}\n"
    )
    settings = load_settings(config, env={})
    chosen = settings.llm_profile()
    assert isinstance(chosen, LLMProfile)
    assert (chosen.name, chosen.model, chosen.settings.fallbacks) == ("claude", "big", ("cheap",))
    assert settings.llm_profile("cheap").settings.temperature == 0.2
    assert settings.llm_profile("openai").model == "gpt-4o"  # the built-in profile stays choosable
    config.write_text("llm:\n  models:\n    x: {provider: nonesuch, model: m}\n")
    assert "expected one of" in config_error(config.read_text(), {}, tmp_path)
    config.write_text("llm:\n  default: missing\n")
    assert "llm.default" in config_error(config.read_text(), {}, tmp_path)


def test_public_dump_is_json_ready() -> None:
    dumped = Settings().public_dump()
    assert json.loads(json.dumps(dumped)) == dumped
    assert dumped["contexts"]["base_dir"] == "logs/contexts"
