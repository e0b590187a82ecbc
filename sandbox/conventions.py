"""The peers' setup conventions, read so that a repository prepared for them works unchanged (SPEC §17):
a dev container's lifecycle commands and GitHub Copilot's ``copilot-setup-steps`` workflow.

Each reader turns the file's text into a :class:`~sandbox.steps.Declaration`, or raises a one-line
:class:`~sandbox.steps.DeclarationError` naming the file, what is wrong and, when the parser knows it, the line.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping
from typing import Any

import json5
import yaml

from sandbox.steps import Declaration, DeclarationError, SetupStep

DEVCONTAINER_FILES = (".devcontainer/devcontainer.json", ".devcontainer.json")
# The dev container's lifecycle commands that prepare a workspace, in the order the specification runs them.
LIFECYCLE_COMMANDS = ("onCreateCommand", "updateContentCommand", "postCreateCommand")
# What a dev container declares that the worker does not do: it runs in the worker image's toolchains.
DEVCONTAINER_NOT_HONOURED = (
    "image",
    "build",
    "dockerFile",
    "dockerComposeFile",
    "features",
    "containerEnv",
    "remoteEnv",
    "initializeCommand",
    "postStartCommand",
    "postAttachCommand",
)
COPILOT_WORKFLOW = ".github/workflows/copilot-setup-steps.yml"
COPILOT_JOB = "copilot-setup-steps"
COPILOT_JOB_NOT_HONOURED = ("container", "services")
# GitHub runs a `run:` step as `bash --noprofile --norc -eo pipefail {0}`; `sh` as `sh -e {0}`.
SHELL_PRELUDES = {"bash": "set -eo pipefail\n", "sh": "set -e\n"}
_JSON5_POSITION = re.compile(r"^<string>:(\d+) (.*)$", re.DOTALL)


def devcontainer(relative: str, text: str) -> Declaration:
    """The lifecycle commands of a devcontainer.json (JSON with comments): string, array or object forms."""
    data = _parse_jsonc(relative, text)
    steps: list[SetupStep] = []
    for hook in LIFECYCLE_COMMANDS:
        steps.extend(_lifecycle_steps(relative, hook, data.get(hook)))
    notes = tuple(
        f"{relative}: {key} is not honoured (the setup runs with the worker image's toolchains)"
        for key in DEVCONTAINER_NOT_HONOURED
        if key in data
    )
    return Declaration(source=relative, steps=tuple(steps), notes=notes)


def _parse_jsonc(relative: str, text: str) -> dict[str, Any]:
    try:
        data = json5.loads(text)
    except ValueError as exc:
        message = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
        position = _JSON5_POSITION.match(message)
        if position:
            message = f"{position.group(2)} (line {position.group(1)})"
        raise DeclarationError(f"{relative}: {message}") from exc
    if not isinstance(data, dict):
        raise DeclarationError(f"{relative}: not a JSON object")
    return data


def _lifecycle_steps(relative: str, hook: str, value: object) -> list[SetupStep]:
    """A string runs with bash; an array is one command without a shell; an object names parallel commands."""
    if value is None:
        return []
    if isinstance(value, dict):
        # The specification runs an object's commands in parallel; one after another, by name, is reproducible.
        commands = [(f"{hook} {name}", _command(relative, f"{hook}.{name}", value[name])) for name in sorted(value)]
    else:
        commands = [(hook, _command(relative, hook, value))]
    return [SetupStep(name=name, script=script) for name, script in commands if script.strip()]


def _command(relative: str, where: str, value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(part, str) for part in value):
        return shlex.join(value)
    raise DeclarationError(f"{relative}: {where} must be a string, an array of strings or an object of those")


def copilot_setup_steps(relative: str, text: str) -> Declaration:
    """The ``run:`` steps of the ``copilot-setup-steps`` job, in order, with their env and working directory."""
    job, workflow = _copilot_job(relative, text)
    where = f"jobs.{COPILOT_JOB}"
    base_env = {**_env(relative, "env", workflow.get("env")), **_env(relative, f"{where}.env", job.get("env"))}
    defaults = {**_run_defaults(relative, "defaults", workflow), **_run_defaults(relative, f"{where}.defaults", job)}
    raw_steps = job.get("steps")
    if not isinstance(raw_steps, list):
        raise DeclarationError(f"{relative}: {where}.steps must be a list of steps")
    notes = [f"{relative}: {where}.{key} is not honoured" for key in COPILOT_JOB_NOT_HONOURED if key in job]
    steps: list[SetupStep] = []
    for index, raw in enumerate(raw_steps):
        step_where = f"{where}.steps[{index}]"
        if not isinstance(raw, dict):
            raise DeclarationError(f"{relative}: {step_where} is not a mapping")
        label = str(raw.get("name") or raw.get("id") or f"step {index + 1}")
        if "uses" in raw:
            notes.append(f"{relative}: step {label!r} (uses: {raw['uses']}) is skipped: actions are not run")
            continue
        step, step_notes = _run_step(relative, step_where, label, raw, base_env, defaults)
        notes.extend(step_notes)
        if step is not None:
            steps.append(step)
    return Declaration(source=relative, steps=tuple(steps), notes=tuple(notes), github_files=True)


def _copilot_job(relative: str, text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        workflow = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise DeclarationError(f"{relative}: {_yaml_problem(exc)}") from exc
    if not isinstance(workflow, dict):
        raise DeclarationError(f"{relative}: not a workflow (a mapping with jobs:)")
    jobs = workflow.get("jobs")
    job = jobs.get(COPILOT_JOB) if isinstance(jobs, dict) else None
    if not isinstance(job, dict):
        raise DeclarationError(f"{relative}: no job named {COPILOT_JOB}")
    return job, workflow


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        problem = exc.problem or exc.context or "not valid YAML"
        mark = exc.problem_mark or exc.context_mark
        return f"{problem} (line {mark.line + 1})" if mark is not None else problem
    return str(exc).splitlines()[0] if str(exc) else "not valid YAML"


def _run_step(
    relative: str,
    where: str,
    label: str,
    raw: Mapping[str, Any],
    base_env: Mapping[str, str],
    defaults: Mapping[str, str],
) -> tuple[SetupStep | None, list[str]]:
    run = raw.get("run")
    if not isinstance(run, str):
        raise DeclarationError(f"{relative}: {where} has neither run: (a string) nor uses:")
    shell = str(raw.get("shell") or defaults.get("shell") or "bash")
    if shell not in SHELL_PRELUDES:
        return None, [f"{relative}: step {label!r} is skipped: shell {shell!r} is not supported (bash or sh)"]
    env = {**base_env, **_env(relative, f"{where}.env", raw.get("env"))}
    directory = raw.get("working-directory", defaults.get("working-directory", "."))
    notes = []
    if "if" in raw:
        notes.append(f"{relative}: step {label!r}: its if: is not evaluated (the step runs)")
    if "${{" in run or any("${{" in value for value in env.values()):
        notes.append(f"{relative}: step {label!r}: ${{{{ }}}} expressions are not evaluated")
    step = SetupStep(
        name=label,
        script=SHELL_PRELUDES[shell] + run,
        env=env,
        working_directory=_inside(relative, f"{where}.working-directory", directory),
    )
    return step, notes


def _env(relative: str, where: str, value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise DeclarationError(f"{relative}: {where} must be a mapping of names to values")
    env = {}
    for name, item in value.items():
        if isinstance(item, dict | list) or item is None:
            raise DeclarationError(f"{relative}: {where}.{name} must be a string, a number or a boolean")
        # YAML reads `CI: true` as a boolean; GitHub passes it on as the string "true".
        env[str(name)] = str(item).lower() if isinstance(item, bool) else str(item)
    return env


def _run_defaults(relative: str, where: str, holder: Mapping[str, Any]) -> dict[str, str]:
    defaults = holder.get("defaults")
    run = defaults.get("run") if isinstance(defaults, dict) else None
    if run is None:
        return {}
    if not isinstance(run, dict):
        raise DeclarationError(f"{relative}: {where}.run must be a mapping")
    return {key: str(run[key]) for key in ("shell", "working-directory") if key in run}


def _inside(relative: str, where: str, directory: object) -> str:
    """A working directory relative to the checkout; one that leaves it is an error."""
    if not isinstance(directory, str) or not directory.strip():
        raise DeclarationError(f"{relative}: {where} must be a path")
    normal = posixpath.normpath(directory)
    if posixpath.isabs(normal) or normal == ".." or normal.startswith("../"):
        raise DeclarationError(f"{relative}: {where} {directory!r} leaves the checkout")
    return normal
