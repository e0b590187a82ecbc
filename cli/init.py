"""``tasuki init``: from a fresh clone to a working configuration in one command (issue 41).

It asks (or takes flags for) the forge and its credential, the model profile, the sandbox's network, the broker
and the fleet store; sends the model one real request and says what came back; writes ``config.yaml`` with only
the keys chosen, each commented, and ``tasuki.env`` (mode 0600) with the secrets, which never go into
``config.yaml``; prints the webhook URL and a fresh webhook secret to paste into the forge; and ends with
``tasuki doctor``. With ``--yes`` nothing is asked: a flag not given takes its default.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cli.common import UsageError, out
from worker.env_file import ENV_FILE, render

if TYPE_CHECKING:
    from worker.settings_models import Settings

FORGES = ("github", "gitlab", "gitea", "local")
PROVIDERS = ("openai", "anthropic", "ollama", "openai-responses")
NETWORKS = ("full", "allowlist", "none")
DEFAULT_MODEL = {"openai": "gpt-4o", "openai-responses": "gpt-4o", "anthropic": "claude-sonnet-4-5",
                 "ollama": "qwen3:30b"}
DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "openai-responses": "OPENAI_API_KEY",
                   "anthropic": "ANTHROPIC_API_KEY", "ollama": ""}
TOKEN_ENV = {"github": "GITHUB_TOKEN", "gitlab": "GITLAB_TOKEN", "gitea": "GITEA_TOKEN"}
SECRET_ENV = {"github": "GITHUB_WEBHOOK_SECRET", "gitlab": "GITLAB_WEBHOOK_SECRET", "gitea": "GITEA_WEBHOOK_SECRET"}
DEFAULT_API = {"github": "https://api.github.com", "gitlab": "https://gitlab.com/api/v4",
               "gitea": "https://gitea.com/api/v1"}
APP_MANIFEST = {"github": "tasuki github app-manifest"}
"""The forges with an App to authenticate as, and the command printing the manifest that creates it."""


def uses_app(a: Answers) -> bool:
    """Whether the forge is reached as an App (its private key) rather than with a token."""
    return a.forge in APP_MANIFEST and a.auth == "app"


def init_arguments(parser: argparse.ArgumentParser) -> None:
    """Every question has a flag, so automation never meets a prompt."""
    parser.add_argument("--forge", choices=FORGES, help="where tasks come from (local: repositories on disk)")
    parser.add_argument("--auth", choices=("token", "app"), help="GitHub: a token, or a GitHub App")
    parser.add_argument("--api-url", help="the forge's REST API root (default: the public instance)")
    parser.add_argument("--model-provider", choices=PROVIDERS, help="the model's API")
    parser.add_argument("--model", help="the model's name on that API")
    parser.add_argument("--base-url", help="the API's base URL (vLLM, LM Studio, the replay model); default: the "
                        "vendor's")
    parser.add_argument("--api-key-env", help="the environment variable holding the model's API key")
    parser.add_argument("--network", choices=NETWORKS, help="the sandbox's network")
    parser.add_argument("--broker", help="a Redis URL, or embedded (`tasuki up` starts its own)")
    parser.add_argument("--store", help="the fleet's PostgreSQL URL, or none (one host)")
    parser.add_argument("--webhook-url", help="this host's public URL the forge sends webhooks to")
    parser.add_argument("--dir", type=Path, default=Path("."), help="where config.yaml and tasuki.env go")
    parser.add_argument("--yes", action="store_true", help="ask nothing: take the defaults of flags not given")
    parser.add_argument("--force", action="store_true", help="overwrite an existing config.yaml")


@dataclass
class Answers:
    """What init learnt, flag or prompt."""

    forge: str = "local"
    auth: str = "token"
    api_url: str | None = None
    provider: str = "openai"
    model: str = "gpt-4o"
    base_url: str | None = None
    api_key_env: str = ""
    network: str = "full"
    broker: str = "embedded"
    store: str = "none"
    webhook_url: str = "http://localhost:8080"
    secrets: dict[str, str] = field(default_factory=dict)


class Asker:
    """A flag's value when given; else the prompt's answer (``--yes``: the default without asking)."""

    def __init__(self, yes: bool) -> None:
        self.yes = yes

    def __call__(self, given: str | None, question: str, default: str, choices: tuple[str, ...] = ()) -> str:
        if given is not None:
            return given
        if self.yes:
            return default
        shown = f" [{'/'.join(choices)}]" if choices else ""
        while True:
            try:
                answer = input(f"{question}{shown} ({default}): ").strip() or default
            except EOFError:
                raise UsageError(f"no answer to {question!r} (stdin closed); pass the flags and --yes") from None
            if not choices or answer in choices:
                return answer
            out(f"  one of: {', '.join(choices)}")


def gather(args: argparse.Namespace) -> Answers:
    """Every answer, in the order a newcomer meets the questions."""
    ask = Asker(args.yes)
    a = Answers()
    a.forge = ask(args.forge, "Forge", "local", FORGES)
    if a.forge in APP_MANIFEST:
        a.auth = ask(args.auth, f"{a.forge} authentication", "token", ("token", "app"))
    if a.forge != "local":
        a.api_url = ask(args.api_url, f"{a.forge} API root", DEFAULT_API[a.forge])
    a.provider = ask(args.model_provider, "Model provider", "openai", PROVIDERS)
    a.model = ask(args.model, "Model", DEFAULT_MODEL[a.provider])
    a.base_url = ask(args.base_url, "Model base URL (empty: the vendor's)", "") or None
    a.api_key_env = ask(args.api_key_env, "Environment variable of the API key", DEFAULT_KEY_ENV[a.provider])
    a.network = ask(args.network, "Sandbox network", "full", NETWORKS)
    a.broker = ask(args.broker, "Broker: a Redis URL or embedded", "embedded")
    a.store = ask(args.store, "Fleet store: a PostgreSQL URL or none", "none")
    if a.forge != "local":
        a.webhook_url = ask(args.webhook_url, "Public URL of this host (for webhooks)", "http://localhost:8080")
    a.secrets = gather_secrets(a, ask)
    return a


def gather_secrets(a: Answers, ask: Asker) -> dict[str, str]:
    """The secrets for tasuki.env: from the environment when set there, else asked (never a flag: a flag shows in
    ``ps`` and the shell's history)."""
    found: dict[str, str] = {}
    wanted = [a.api_key_env] if a.api_key_env else []
    if a.forge in TOKEN_ENV and not uses_app(a):
        wanted.append(TOKEN_ENV[a.forge])
    for name in wanted:
        value = os.environ.get(name) or ask(None, f"{name} (empty: set it later in {ENV_FILE})", "")
        if value:
            found[name] = value
    if a.forge in SECRET_ENV:
        found[SECRET_ENV[a.forge]] = os.environ.get(SECRET_ENV[a.forge]) or secrets.token_hex(32)
    return found


def render_config(a: Answers) -> str:
    """``config.yaml`` with only the keys chosen, each with its comment (never a secret)."""
    import json

    def q(value: str) -> str:
        return json.dumps(value)

    lines = ["# Written by `tasuki init`. Every key not here takes its built-in default (the checkout's",
             f"# config.yaml lists them all). Secrets live in {ENV_FILE} beside it, never here; every tasuki",
             "# command using this file reads them (a variable already set in the environment wins).", ""]
    if a.broker != "embedded":
        lines += ["broker:", f"  url: {q(a.broker)}    # Redis of the queue and the heartbeats", ""]
    profile = ["    model: " + q(a.model) + "    # the model's name on its API",
               f"    provider: {a.provider}    # the API it speaks"]
    if a.base_url:
        profile.append(f"    base_url: {q(a.base_url)}    # where the API is")
    if a.api_key_env and a.api_key_env != DEFAULT_KEY_ENV[a.provider]:
        profile.append(f"    api_key_env: {a.api_key_env}    # the environment variable holding its key")
    lines += ["llm:", "  default: main    # the profile a task that names none uses", "  models:", "    main:"]
    lines += ["  " + line for line in profile]
    lines.append("")
    if a.forge in DEFAULT_API and a.api_url and a.api_url != DEFAULT_API[a.forge]:
        lines += [f"{a.forge}:", f"  api_url: {q(a.api_url)}    # the forge's REST API root"]
        if uses_app(a):
            lines.append("  auth: app    # a GitHub App: set app_id once it exists (tasuki github app-manifest)")
        lines.append("")
    elif uses_app(a):
        lines += [f"{a.forge}:", "  auth: app    # an App: set app_id once it exists (tasuki github app-manifest)", ""]
    lines += ["sandbox:", f"  network: {a.network}    # the agent's network: full | allowlist | none", ""]
    if a.store != "none":
        lines += ["fleet:", f"  store: {q(a.store)}    # PostgreSQL of the fleet (password: PGPASSWORD)", ""]
    return "\n".join(lines)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable only by its owner, from the first byte on."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path, 0o600)


def only_defaults(config_path: Path) -> bool:
    """Whether ``config_path`` chooses nothing: every value in it is the built-in default, as in the reference
    config.yaml a fresh clone ships. Replacing it loses nothing, so a new user's first ``init`` needs no --force."""
    from worker.settings import ConfigError, load_settings

    try:
        return not load_settings(config_path, env={}).source.configured
    except (ConfigError, OSError):
        return False  # unreadable or invalid: somebody's work in progress, kept unless --force says otherwise


def cmd_init(args: argparse.Namespace, settings: Settings) -> int:
    """Ask, check the model, write both files, print the webhook's URL and secret, run the doctor."""
    from cli.doctor import check_model
    from worker.settings import load_settings

    directory: Path = args.dir
    config_path, env_path = directory / "config.yaml", directory / ENV_FILE
    if config_path.exists() and not args.force and not only_defaults(config_path):
        raise UsageError(f"{config_path} exists and chooses settings of its own; pass --force to overwrite it")
    answers = gather(args)
    directory.mkdir(parents=True, exist_ok=True)
    config_path.write_text(render_config(answers), encoding="utf-8")
    write_private(env_path, render(answers.secrets))
    os.environ.update(answers.secrets)  # this process's doctor sees them as a later command reading the file would
    out(f"wrote {config_path} and {env_path} (0600, the secrets)")
    written = load_settings(config_path)
    model = check_model(written)
    out(f"model check: {model.line()}")
    _print_forge_steps(answers)
    out(f"\ntasuki commands using {config_path} read {env_path} themselves (the environment wins)")
    out("\n$ tasuki doctor")
    from cli.doctor import run_checks

    forges = [answers.forge] if answers.forge in TOKEN_ENV else []
    checks = run_checks(written, forges=forges)
    sys.stdout.flush()
    return 0 if all(check.ok for check in checks) else 1


def _print_forge_steps(a: Answers) -> None:
    """What to paste into the forge: the webhook's URL and secret (and, for a GitHub App, the manifest)."""
    if a.forge == "local":
        out("forge: local — submit tasks with `tasuki submit --repo-path PATH --prompt TEXT`; no webhook")
        return
    base = a.webhook_url.rstrip("/")
    out(f"\nwebhook URL to paste into {a.forge}: {base}/webhooks/{a.forge}")
    out(f"webhook secret (also in {ENV_FILE} as {SECRET_ENV[a.forge]}): {a.secrets[SECRET_ENV[a.forge]]}")
    if uses_app(a):
        out(f"GitHub App: `{APP_MANIFEST[a.forge]} --webhook-url {base}` prints the manifest to create it with "
            "(docs/github-app.md); then set github.app_id and GITHUB_APP_PRIVATE_KEY_PATH")
