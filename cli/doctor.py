"""``tasuki doctor``: one line per configured part, OK or FAIL with the fix (issue 41).

Each check does the smallest real thing the part must do in production — Redis answers PING, the contexts
directory takes a file, the model answers one request, the forge accepts the token on an authenticated GET,
bubblewrap runs ``true``, PostgreSQL accepts a connection — so an OK means the part works, not that a
setting is spelt right. Exit 0 when every line is OK, 1 when any FAILs.
"""

from __future__ import annotations

import argparse
import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cli.common import out

if TYPE_CHECKING:
    from worker.settings_models import Settings

PROBE_TOOL_NAME = "finish"
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": PROBE_TOOL_NAME,
        "description": "Say you are done.",
        "parameters": {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]},
    },
}
PROBE_MESSAGES = [
    {"role": "system", "content": "You are checked by `tasuki doctor`. Call the finish tool."},
    {"role": "user", "content": "Call the finish tool with summary 'ok'."},
]


@dataclass(frozen=True)
class Check:
    """What one check found: a part's name, whether it works, what was seen, and how to fix it when not."""

    part: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        """``OK part: detail`` or ``FAIL part: detail — fix: ...``."""
        if self.ok:
            return f"OK {self.part}: {self.detail}"
        return f"FAIL {self.part}: {self.detail} — fix: {self.fix}"


def doctor_arguments(parser: argparse.ArgumentParser) -> None:
    """Which forge to check (default: every forge with a token in the environment)."""
    parser.add_argument("--forge", choices=("github", "gitlab", "gitea"), action="append",
                        help="check this forge's credential (repeatable; default: each forge with a credential)")


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    """Run every check, print its line, exit 1 when any failed."""
    checks = run_checks(settings, forges=args.forge)
    return 0 if all(check.ok for check in checks) else 1


def run_checks(settings: Settings, *, forges: list[str] | None = None,
               emit: Callable[[str], None] = out) -> list[Check]:
    """Every check in order, each printed as soon as it is known (a slow model does not hide the rest)."""
    steps: list[Callable[[], Check]] = [
        lambda: Check("config", True, settings.source.describe()),
        lambda: check_broker(settings),
        lambda: check_contexts(settings),
        lambda: check_model(settings),
    ]
    for forge in forges if forges is not None else configured_forges(settings):
        steps.append(lambda forge=forge: check_forge(settings, forge))  # type: ignore[misc]
    steps.append(lambda: check_sandbox(settings))
    if settings.fleet.store:
        steps.append(lambda: check_store(settings))
    checks = []
    for step in steps:
        check = step()
        emit(check.line())
        checks.append(check)
    return checks


def configured_forges(settings: Settings) -> list[str]:
    """The forges with a credential in the environment (or a GitHub App configured)."""
    secrets = settings.secrets
    found = []
    if secrets.github_token or settings.github.auth == "app":
        found.append("github")
    if secrets.gitlab_token:
        found.append("gitlab")
    if secrets.gitea_token:
        found.append("gitea")
    return found


def _first(exc: BaseException) -> str:
    from contexts.masking import mask

    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return mask(text)[:200]


def check_broker(settings: Settings) -> Check:
    """Redis answers PING at ``broker.url``."""
    import redis

    from contexts.masking import mask

    url = settings.broker.url
    shown = mask(url)
    if "url" not in settings.broker.model_fields_set:  # `tasuki up` then starts its own, whatever answers here
        return Check("broker", True, "none configured: `tasuki up` starts its own (embedded) Redis")
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2).ping()
    except (redis.RedisError, OSError, ValueError) as exc:
        return Check("broker", False, f"Redis at {shown} does not answer ({_first(exc)})",
                     "start Redis there, set broker.url (or TASUKI__BROKER__URL), or run `tasuki up`, "
                     "which starts its own")
    return Check("broker", True, f"Redis at {shown} answers PING")


def check_contexts(settings: Settings) -> Check:
    """The context store's directory exists (or can be made) and takes a file only its owner can read."""
    base = settings.contexts.base_dir
    try:
        base.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=base, prefix=".doctor-") as probe:
            probe.write(b"ok")
            probe.flush()
            mode = stat.S_IMODE(os.stat(probe.name).st_mode)
    except OSError as exc:
        return Check("contexts", False, f"{base} is not writable ({exc.strerror or exc})",
                     f"make {base} writable by this user (chown/chmod), or set contexts.base_dir")
    if mode & 0o077:
        return Check("contexts", False, f"files under {base} are made readable by others (mode {mode:o})",
                     "run Tasuki with umask 077")
    dir_mode = stat.S_IMODE(base.stat().st_mode)
    if dir_mode & 0o002:
        return Check("contexts", False, f"{base} is writable by anyone (mode {dir_mode:o})", f"chmod o-w {base}")
    return Check("contexts", True, f"{base} is writable (new files {mode:o})")


def check_model(settings: Settings) -> Check:
    """The default profile answers one real request, through the providers a task uses; says whether the answer
    carried a tool call (a model that never calls tools cannot do a task)."""
    from agent.llm import registry
    from agent.llm.retry import RetryPolicy
    from agent.llm.textcalls import text_calls
    from worker.runtime import llm_config, model_spec

    try:
        config = llm_config(settings)
        spec = model_spec(config, settings)
    except (KeyError, ValueError) as exc:
        return Check("model", False, f"no model profile ({_first(exc)})", "set llm.default or llm.provider")
    where = f"{spec.name} ({spec.provider} {spec.model}" + (f" at {spec.endpoint})" if spec.endpoint else ")")
    try:
        provider = registry.build(spec, RetryPolicy(max_retries=0, retry_for_s=0), timeout_s=60.0)
        reply = provider.chat([dict(m) for m in PROBE_MESSAGES], [PROBE_TOOL])
    except Exception as exc:
        return Check("model", False, f"{where} did not answer: {_first(exc)}",
                     "check the profile's endpoint, model name and API key (the env file), then run again")
    if reply.tool_calls:
        return Check("model", True, f"{where} answered with a tool call ({reply.tool_calls[0].name})")
    written = text_calls(reply.content or "", {PROBE_TOOL_NAME})  # as the agent reads a reply
    if written:
        return Check("model", True, f"{where} answered with a tool call written in its text ({written[0].name}): "
                                    "tasks read those too (docs/models.md), though native calls are surer")
    said = (reply.content or "").strip().replace("\n", " ")[:80]
    return Check("model", False, f"{where} answered without a tool call ({said!r})",
                 "choose a model (or server option) that supports tool calls; tasks need them")


def check_forge(settings: Settings, forge: str) -> Check:
    """The forge accepts the credential on one authenticated GET (``/user``, or ``/app`` for a GitHub App)."""
    from worker.forges import ForgeError, make_forge

    part = f"forge {forge}"
    roots = {"github": settings.github.api_url, "gitlab": settings.gitlab.api_url, "gitea": settings.gitea.api_url}
    api = str(roots[forge]).rstrip("/")
    fix = f"put a valid token in {forge.upper()}_TOKEN (the env file) and check {forge}.api_url"
    try:
        if forge in APP_CHECKS and settings.github.auth == "app":
            return APP_CHECKS[forge](settings, api)
        client = make_forge(forge, settings)
        http = client.http  # type: ignore[attr-defined]
        response = http.request("GET", "user", missing_ok=True, retries=0)
    except ForgeError as exc:
        return Check(part, False, f"{api} refused the credential: {_first(exc)}", fix)
    except Exception as exc:
        return Check(part, False, f"{api} did not answer: {_first(exc)}", f"check {forge}.api_url")
    if response.status_code == 404:
        return Check(part, True, f"{api} accepted the token")
    login = response.json().get("login") or response.json().get("username") or "?"
    return Check(part, True, f"{api} accepted the token (user {login})")


def _check_github_app(settings: Settings, api: str) -> Check:
    from worker.forges.github_app import github_app

    key, app_id = settings.secrets.github_app_private_key, settings.github.app_id
    if key is None or app_id is None:
        return Check("forge github", False, "github.auth is app but github.app_id or the private key is missing",
                     "run `tasuki github app-manifest`, create the App, then set github.app_id and "
                     "GITHUB_APP_PRIVATE_KEY_PATH (docs/github-app.md)")
    app = github_app(api, app_id, key.get_secret_value())
    answer = app._as_app("GET", "app", "the App's own record")
    return Check("forge github", True, f"{api} accepted App {app_id} ({answer.get('slug', '?')})")


APP_CHECKS: dict[str, Callable[[Settings, str], Check]] = {"github": _check_github_app}
"""The forges reached as an App, and the check of the App's own credential."""


def check_sandbox(settings: Settings) -> Check:
    """The configured sandbox runs ``true`` (bubblewrap in its namespaces)."""
    from sandbox.jail import backend as backend_kind
    from sandbox.jail import make_sandbox

    backend = settings.sandbox.backend
    try:
        make_sandbox(settings.sandbox)
    except Exception as exc:
        return Check("sandbox", False, f"{backend} cannot run a command here: {_first(exc)}",
                     "install bubblewrap and socat, allow unprivileged user namespaces, or set "
                     "sandbox.backend: none (trusted models only)")
    if not backend_kind(backend).confines:
        return Check("sandbox", True, "backend none: agent commands run unsandboxed on this host")
    return Check("sandbox", True, f"{backend} runs `true` (network {settings.sandbox.network})")


def check_store(settings: Settings) -> Check:
    """The fleet's PostgreSQL accepts a connection."""
    from contexts.masking import mask

    url = settings.fleet.store or ""
    try:
        import psycopg

        with psycopg.connect(url, connect_timeout=int(settings.fleet.connect_timeout_s)) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return Check("store", False, f"PostgreSQL at {mask(url)} refused: {_first(exc)}",
                     "check fleet.store and PGPASSWORD, or set fleet.store: null for one host")
    return Check("store", True, f"PostgreSQL at {mask(url)} answers")
