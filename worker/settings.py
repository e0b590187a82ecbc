"""The one settings loader: defaults < config.yaml < `TASUKI__SECTION__KEY` environment variables (SPEC §9).

Secrets come only from unprefixed environment variables (`OPENAI_API_KEY`, ...) and are exposed as
`settings.secrets`. Nothing else in Tasuki reads YAML or `os.environ`.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from agent.settings import LLMProfile
from contexts.errors import TasukiError
from contexts.masking import mask_value, register_secrets
from worker.settings_models import ConfigSource, Secrets, Settings

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_CONFIG",
    "ENV_PREFIX",
    "SECRET_VARIABLES",
    "ConfigError",
    "ConfigSource",
    "LLMProfile",
    "Secrets",
    "Settings",
    "config_file",
    "current_settings",
    "install_settings",
    "load_settings",
]

CONFIG_ENV = "TASUKI_CONFIG"
DEFAULT_CONFIG = Path("config.yaml")
ENV_PREFIX = "TASUKI__"
SECRET_VARIABLES = (
    "OPENAI_API_KEY",
    "GITHUB_TOKEN",
    "GITHUB_APP_PRIVATE_KEY",
    "GITLAB_TOKEN",
    "GITHUB_WEBHOOK_SECRET",
    "GITLAB_WEBHOOK_SECRET",
    "GITEA_TOKEN",
    "GITEA_WEBHOOK_SECRET",
    "TASUKI_API_TOKEN",
    "TASUKI_CONSOLE_SESSION_SECRET",
)
PRIVATE_KEY_PATH_ENV = "GITHUB_APP_PRIVATE_KEY_PATH"  # a file holding GITHUB_APP_PRIVATE_KEY (a mounted secret)
_NULLS = ("", "null", "none")

KeyPath = tuple[str, ...]
M = TypeVar("M", bound=BaseModel)


class ConfigError(TasukiError):
    """The configuration cannot be used; the message holds one `config: ...` line per problem."""


def load_settings(
    config_path: str | Path | None = None, env: Mapping[str, str] | None = None, *, cwd: Path | None = None
) -> Settings:
    """Read config.yaml (`config_path`, else `$TASUKI_CONFIG`, else ./config.yaml if present) and `env`.

    Relative paths from the file (and defaults) resolve against the file's directory; relative paths from
    the environment, and everything when there is no file, against the working directory ``cwd``.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    here = (cwd or Path.cwd()).absolute()
    path = config_file(config_path, environ, here)
    data = _read_config_file(path)
    overrides, origins = _environment_overrides(environ)
    try:
        settings = Settings.model_validate(recursive_merge(data, overrides))
    except ValidationError as exc:
        raise ConfigError("\n".join(_describe(error, origins) for error in _one_per_problem(exc.errors()))) from None
    configured = frozenset(set(origins) | _chosen_in_file(data, settings))
    data_dir = _data_dir(settings.local.data_dir, path, here, environ, from_env=("local", "data_dir") in origins)
    source = ConfigSource(path, path.parent if path is not None else data_dir, configured)
    settings = settings.model_copy(update={"local": settings.local.model_copy(update={"data_dir": data_dir})})
    settings = resolve_paths(settings, source.root, env_root=here, from_env=set(origins), default_root=data_dir,
                             configured=configured)
    found = {name.lower(): environ[name] for name in SECRET_VARIABLES if environ.get(name)}
    if environ.get(PRIVATE_KEY_PATH_ENV) and "github_app_private_key" not in found:
        found["github_app_private_key"] = _read_secret_file(environ[PRIVATE_KEY_PATH_ENV], PRIVATE_KEY_PATH_ENV)
    client_secret = environ.get(settings.auth.oidc.client_secret_env)
    if client_secret:  # its variable's name is configured (auth.oidc.client_secret_env)
        found["oidc_client_secret"] = client_secret
    secrets = Secrets.model_validate(found)
    # Secrets that match no token pattern are still masked in every log line and file.
    register_secrets(found.values())
    return settings.with_secrets(secrets).with_source(source)


def _read_secret_file(path: str, variable: str) -> str:
    """The text of the secret file an environment variable names."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config: {variable}: cannot read {path}: {type(exc).__name__}") from None


_current: Settings | None = None


def current_settings() -> Settings:
    """The process's settings: those :func:`install_settings` was given, else loaded once from the environment."""
    global _current  # noqa: PLW0603 - one settings object per process is the point
    if _current is None:
        _current = load_settings()
    return _current


def install_settings(settings: Settings) -> None:
    """Make ``settings`` the process's settings, and its configuration file the one child processes read."""
    global _current  # noqa: PLW0603 - one settings object per process is the point
    _current = settings
    if settings.source.file is not None:
        os.environ[CONFIG_ENV] = str(settings.source.file)


CHECKOUT = Path(__file__).resolve().parents[1]
LAUNCHER = "tasuki"  # the checkout's launcher script, beside pyproject.toml


def default_data_dir(environ: Mapping[str, str]) -> Path:
    """Where Tasuki keeps its own files when nothing says: beside the checkout it runs from (the directory of the
    ``tasuki`` launcher), else ``$XDG_DATA_HOME/tasuki`` (``~/.local/share/tasuki``) for an installed package."""
    if (CHECKOUT / LAUNCHER).is_file() and (CHECKOUT / "pyproject.toml").is_file():
        return CHECKOUT
    xdg = environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path(environ.get("HOME") or Path.home()) / ".local/share"
    return base / "tasuki"


def _data_dir(chosen: Path | None, file: Path | None, here: Path, environ: Mapping[str, str], *,
              from_env: bool) -> Path:
    """``local.data_dir`` made absolute: as chosen (under the working directory from the environment, the file's
    directory from the file), else the configuration file's directory, else :func:`default_data_dir`."""
    if chosen is not None:
        return (here if from_env or file is None else file.parent) / chosen
    return file.parent if file is not None else default_data_dir(environ)


def _chosen_in_file(data: Mapping[str, Any], settings: Settings) -> set[KeyPath]:
    """The keys the file sets to something other than the built-in default."""
    defaults = Settings()
    chosen: set[KeyPath] = set()

    def walk(node: Mapping[str, Any], at: KeyPath) -> None:
        for name, value in node.items():
            key = (*at, str(name))
            if isinstance(value, Mapping) and _model_at(key) is not None and _field_at(key) is not None:
                walk(value, key)
            elif _value_at(settings, key) != _value_at(defaults, key):
                chosen.add(key)

    walk(data, ())
    return chosen


def _value_at(model: BaseModel, key: KeyPath) -> object:
    value: object = model
    for part in key:
        value = getattr(value, part, None)
    return value


def resolve_paths(model: M, root: Path, *, env_root: Path, from_env: set[KeyPath], at: KeyPath = (),
                  default_root: Path | None = None, configured: frozenset[KeyPath] | None = None) -> M:
    """``model`` with every relative ``Path`` value made absolute: under ``env_root`` when an environment
    variable set it, under ``default_root`` (the data directory) when nobody chose it, else under ``root``."""
    updates: dict[str, Any] = {}
    for name in type(model).model_fields:
        value, key = getattr(model, name), (*at, name)
        if isinstance(value, BaseModel):
            section = resolve_paths(value, root, env_root=env_root, from_env=from_env, at=key,
                                    default_root=default_root, configured=configured)
            if section is not value:
                updates[name] = section
        elif _paths(value):
            chosen = configured is None or any(key[:n] in configured for n in range(1, len(key) + 1))
            base = env_root if any(key[:n] in from_env for n in range(1, len(key) + 1)) else root
            base = base if chosen or default_root is None else default_root
            paths = tuple(base / v for v in _paths(value))  # an absolute path stays as it is
            updates[name] = paths if isinstance(value, tuple) else paths[0]
    return model.model_copy(update=updates) if updates else model


def _paths(value: object) -> tuple[Path, ...]:
    """The Path values of a setting (one Path, or a tuple of them)."""
    return tuple(v for v in (value if isinstance(value, tuple) else (value,)) if isinstance(v, Path))


def config_file(config_path: str | Path | None, environ: Mapping[str, str], here: Path) -> Path | None:
    """The configuration file's absolute path, or None when there is none to read."""
    if config_path is not None:
        path, origin = Path(config_path), ""
    elif environ.get(CONFIG_ENV):
        path, origin = Path(environ[CONFIG_ENV]), f" (from {CONFIG_ENV})"
    else:
        default = here / DEFAULT_CONFIG
        return default if default.is_file() else None
    path = path if path.is_absolute() else here / path
    if not path.is_file():
        raise ConfigError(f"config: {path}{origin}: no such file")
    return path


def _read_config_file(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config: cannot read {path}: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise ConfigError(f"config: cannot parse {path}{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path}: expected a mapping of sections, found a {type(data).__name__}")
    return data


def _environment_overrides(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[KeyPath, str]]:
    """Nested overrides from `TASUKI__SECTION__KEY` variables, and which variable set each key."""
    overrides: dict[str, Any] = {}
    origins: dict[KeyPath, str] = {}
    problems: list[str] = []
    # Shallow variables first, so TASUKI__GITHUB__LABELS__DONE refines a JSON TASUKI__GITHUB__LABELS.
    names = sorted((n for n in environ if n.upper().startswith(ENV_PREFIX)), key=lambda n: (n.count("__"), n))
    for name in names:
        path = tuple(part.lower() for part in name[len(ENV_PREFIX) :].split("__"))
        if not all(path):
            problems.append(f"config: {name}: expected a name like TASUKI__SECTION__KEY")
            continue
        try:
            value = _env_value(environ[name], _field_at(path))
        except ValueError as exc:
            problems.append(f"config: {'.'.join(path)} = {_show(environ[name])} (from {name}): {exc}")
            continue
        node = overrides
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[path[-1]] = value
        origins[path] = name
    if problems:
        raise ConfigError("\n".join(problems))
    return overrides, origins


def _env_value(raw: str, field: FieldInfo | None) -> Any:
    """An environment string as the key expects it: JSON for lists and sections, None for null."""
    if field is None:
        return raw  # an unknown key: validation reports it with the keys it could have meant
    annotation = field.annotation
    if _model_class(annotation) is not None or get_origin(annotation) in (list, tuple, dict):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            raise ValueError('expected JSON, e.g. ["OWNER", "MEMBER"] or {"key": "value"}') from None
    if type(None) in get_args(annotation) and raw.strip().lower() in _NULLS:
        return None
    return raw


def _model_class(annotation: object) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _one_per_problem(errors: list[ErrorDetails]) -> list[ErrorDetails]:
    """A misspelt required key is one problem: the unknown key says it (with "did you mean"), not also a
    "Field required" for the key it was meant to be."""
    unknown = {tuple(e["loc"]) for e in errors if e["type"] == "extra_forbidden"}

    def misspelt(error: ErrorDetails) -> bool:
        loc = tuple(error["loc"])
        siblings = [str(u[-1]) for u in unknown if u[:-1] == loc[:-1]]
        return error["type"] == "missing" and bool(difflib.get_close_matches(str(loc[-1]), siblings, n=1))

    return [error for error in errors if not misspelt(error)]


def _model_at(path: KeyPath) -> type[BaseModel] | None:
    """The settings model whose keys ``path`` names: a section, or the value model of a mapping such as
    ``pricing`` (whose keys are the operator's names)."""
    if not path:
        return Settings
    field = _field_at(path)
    if field is not None:
        return _model_class(field.annotation)
    mapping = _field_at(path[:-1])
    if mapping is not None and get_origin(mapping.annotation) is dict:
        return _model_class(get_args(mapping.annotation)[1])
    return None


def _field_at(path: KeyPath) -> FieldInfo | None:
    """The field a dotted key path names, or None when no such key exists."""
    model: type[BaseModel] | None = Settings
    field = None
    for part in path:
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return None
        model = _model_class(field.annotation)
    return field


def recursive_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` laid over it, nested mappings merged key by key (mini-swe-agent's way)."""
    merged = dict(base)
    for key, value in overrides.items():
        below = merged.get(key)
        merged[key] = recursive_merge(below, value) if isinstance(below, dict) and isinstance(value, dict) else value
    return merged


def _describe(error: ErrorDetails, origins: dict[KeyPath, str]) -> str:
    """One line naming the key, its value, what was expected and the variable it came from."""
    path = tuple(str(part) for part in error["loc"])
    ctx = error.get("ctx") or {}
    value: object = error["input"]
    if error["type"] == "cross_field":
        path += tuple(str(ctx["field"]).split("."))
        value, expected = ctx["value"], str(ctx["expected"])
    else:
        expected = _expected(error, path)
    # The variable that set this key or a section around it, else one that set a key inside it.
    origin = next((origins[path[:n]] for n in range(len(path), 0, -1) if path[:n] in origins), None)
    origin = origin or next((name for key, name in origins.items() if key[: len(path)] == path), None)
    where = f" (from {origin})" if origin else ""
    return f"config: {'.'.join(path)} = {_show(value)}{where}: {expected}"


_FIXED_EXPECTATIONS = {
    "missing": "missing: this key has no default",
    "model_type": "expected a mapping of keys",
    "model_attributes_type": "expected a mapping of keys",
    "dict_type": "expected a mapping of keys",
    "string_too_short": "expected a non-empty string",
}


def _expected(error: ErrorDetails, path: KeyPath) -> str:
    kind, message = error["type"], error["msg"]
    ctx = error.get("ctx") or {}
    if kind == "literal_error":
        return "expected one of " + ", ".join(re.findall(r"'([^']*)'", str(ctx.get("expected", ""))))
    if kind == "extra_forbidden":
        model = _model_at(path[:-1])
        known = list(model.model_fields) if model is not None else []
        close = difflib.get_close_matches(path[-1], known, n=1)
        return "unknown key" + (f" (did you mean {close[0]}?)" if close else f"; known: {', '.join(known)}")
    if kind in _FIXED_EXPECTATIONS:
        return _FIXED_EXPECTATIONS[kind]
    message = message.removeprefix("Value error, ")
    if message.startswith("Input should be "):
        return "expected " + message.removeprefix("Input should be ")
    return message


def _show(value: object) -> str:
    shown = repr(mask_value(value))
    return shown if len(shown) <= 80 else shown[:77] + "..."
