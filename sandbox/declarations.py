"""Where a repository's environment is declared (SPEC §17 "Declaration"): the first source found wins.

1. ``.tasuki/setup.sh`` in the repository;
2. the operator's ``environments.repositories[REPOSITORY].setup``;
3. the peers' conventions: ``.devcontainer/devcontainer.json`` (or ``.devcontainer.json``),
   ``.openhands/setup.sh``, ``.github/workflows/copilot-setup-steps.yml``;
4. ``environments.auto``: the table of :mod:`sandbox.autoinstall`.

A peer's file that declares no command to run (a dev container with only an ``image``, a workflow with only
``uses:`` steps) is no declaration: the search goes on, and its notes go with whatever is found.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sandbox.autoinstall import AUTO_INSTALLS, auto_declaration, top_files
from sandbox.conventions import COPILOT_WORKFLOW, DEVCONTAINER_FILES, copilot_setup_steps, devcontainer
from sandbox.settings import EnvironmentsSettings
from sandbox.steps import Declaration, DeclarationError, SetupStep, decode, read_inside

__all__ = ["Declaration", "DeclarationError", "SetupStep", "find_declaration", "key_files"]

TASUKI_SETUP = ".tasuki/setup.sh"
OPENHANDS_SETUP = ".openhands/setup.sh"
EVAL_SETUP = "the eval set's setup"  # a task set row's own script (issue 39)


def _script_file(relative: str, text: str) -> Declaration:
    # The script's text is the step, so the environment's key follows every edit of it.
    return Declaration(source=relative, steps=(SetupStep(name=relative, script=text),))


# The peers' files, in the order SPEC §17 lists them: (path in the checkout, reader of its text).
PEER_FILES: tuple[tuple[str, Callable[[str, str], Declaration]], ...] = (
    *((name, devcontainer) for name in DEVCONTAINER_FILES),
    (OPENHANDS_SETUP, _script_file),
    (COPILOT_WORKFLOW, copilot_setup_steps),
)


def find_declaration(checkout: Path, repository: str, settings: EnvironmentsSettings,
                     setup: str | None = None) -> Declaration | None:
    """The repository's declaration (first found wins), or None: no setup. Raises DeclarationError (one line).
    ``setup``: an eval task's script, which takes the place of every source (a blank one declares nothing)."""
    if setup is not None:
        return Declaration(EVAL_SETUP, (SetupStep(name=EVAL_SETUP, script=setup),)) if setup.strip() else None
    own = _read(checkout, TASUKI_SETUP)
    if own is not None:
        return _script_file(TASUKI_SETUP, own)
    operator = settings.for_repository(repository)
    if operator is not None and operator.setup is not None:
        name = f"environments.repositories[{repository}]"
        return Declaration(source=name, steps=(SetupStep(name=name, script=operator.setup),))
    carried: list[str] = []
    for relative, reader in PEER_FILES:
        text = _read(checkout, relative)
        if text is None:
            continue
        found = reader(relative, text)
        if found.steps:
            return Declaration(found.source, found.steps, (*carried, *found.notes), found.github_files)
        carried.extend((*found.notes, f"{relative}: declares no command to run"))
    automatic = auto_declaration(checkout) if settings.auto else None
    if automatic is None:
        return None
    return Declaration(automatic.source, automatic.steps, tuple(carried), automatic.github_files)


def _read(checkout: Path, relative: str) -> str | None:
    data = read_inside(checkout, relative)
    return None if data is None else decode(relative, data)


def key_files(checkout: Path, settings: EnvironmentsSettings) -> dict[str, bytes]:
    """``{path relative to the checkout: content}`` of the table's lockfiles and manifests found at the top,
    and of the files matching ``environments.key_files``: what the environment's key depends on."""
    names = {name for row in AUTO_INSTALLS for pattern in row.names for name in top_files(checkout, pattern)}
    for pattern in settings.key_files:
        try:
            matches = list(checkout.glob(pattern))
        except (NotImplementedError, ValueError) as exc:
            message = f"environments.key_files: {pattern!r} is not a glob relative to the checkout"
            raise DeclarationError(message) from exc
        for path in matches:
            relative = path.relative_to(checkout).as_posix()
            if not relative.startswith(".git/"):
                names.add(relative)
    files = {}
    for relative in sorted(names):
        try:
            content = read_inside(checkout, relative)
        except DeclarationError:
            continue  # a directory, or a symlink out of the checkout: nothing of the repository's own to key on
        if content is not None:
            files[relative] = content
    return files
