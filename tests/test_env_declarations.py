"""Where a repository's environment is declared (SPEC §17 "Declaration"): every form, the precedence, the
auto table, the files that key an environment, and bad files as one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.autoinstall import AUTO_INSTALLS
from sandbox.declarations import Declaration, DeclarationError, SetupStep, find_declaration, key_files
from sandbox.settings import EnvironmentsSettings, RepositoryEnvironment

ROOT = Path(__file__).resolve().parents[1]
REPOSITORY = "owner/repo"


def write(checkout: Path, relative: str, text: str) -> None:
    path = checkout / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def found(checkout: Path, settings: EnvironmentsSettings | None = None) -> Declaration:
    declaration = find_declaration(checkout, REPOSITORY, settings or EnvironmentsSettings())
    assert declaration is not None
    return declaration


def scripts(declaration: Declaration) -> list[str]:
    return [step.script for step in declaration.steps]


def test_tasuki_setup_sh_is_one_step_with_the_scripts_text(tmp_path: Path) -> None:
    write(tmp_path, ".tasuki/setup.sh", "#!/bin/bash\nset -e\nmake deps\n")
    declaration = found(tmp_path)
    assert declaration.source == ".tasuki/setup.sh"
    assert declaration.steps == (SetupStep(name=".tasuki/setup.sh", script="#!/bin/bash\nset -e\nmake deps\n"),)
    assert declaration.steps[0].working_directory == "."
    assert not declaration.github_files


def test_the_operators_setup_matches_the_repository_exactly(tmp_path: Path) -> None:
    settings = EnvironmentsSettings(
        repositories={
            "owner/repo": RepositoryEnvironment(setup="pip install -r dev.txt"),
            "/srv/git/local": RepositoryEnvironment(setup="make local"),
            "owner/repo-other": RepositoryEnvironment(setup="never"),
        }
    )
    declaration = found(tmp_path, settings)
    assert declaration.source == "environments.repositories[owner/repo]"
    assert scripts(declaration) == ["pip install -r dev.txt"]
    local = find_declaration(tmp_path, "/srv/git/local", settings)
    assert local is not None
    assert scripts(local) == ["make local"]
    assert find_declaration(tmp_path, "owner/Repo", settings.model_copy(update={"auto": False})) is None


def test_an_operator_entry_with_services_only_declares_no_setup(tmp_path: Path) -> None:
    settings = EnvironmentsSettings(repositories={REPOSITORY: RepositoryEnvironment()}, auto=False)
    assert find_declaration(tmp_path, REPOSITORY, settings) is None


def test_precedence_first_found_wins(tmp_path: Path) -> None:
    settings = EnvironmentsSettings(repositories={REPOSITORY: RepositoryEnvironment(setup="operator")})
    write(tmp_path, "uv.lock", "")
    assert found(tmp_path).source == "auto (uv.lock)"
    write(tmp_path, ".github/workflows/copilot-setup-steps.yml", COPILOT)
    assert found(tmp_path).source == ".github/workflows/copilot-setup-steps.yml"
    write(tmp_path, ".openhands/setup.sh", "openhands")
    assert found(tmp_path).source == ".openhands/setup.sh"
    write(tmp_path, ".devcontainer.json", '{"postCreateCommand": "top"}')
    assert found(tmp_path).source == ".devcontainer.json"
    write(tmp_path, ".devcontainer/devcontainer.json", '{"postCreateCommand": "nested"}')
    assert found(tmp_path).source == ".devcontainer/devcontainer.json"
    assert found(tmp_path, settings).source == f"environments.repositories[{REPOSITORY}]"
    write(tmp_path, ".tasuki/setup.sh", "own")
    assert found(tmp_path, settings).source == ".tasuki/setup.sh"


def test_nothing_declared_nor_detected_is_no_setup(tmp_path: Path) -> None:
    write(tmp_path, "README.md", "hello")
    assert find_declaration(tmp_path, REPOSITORY, EnvironmentsSettings()) is None


DEVCONTAINER = """// A dev container as VS Code writes it: comments and trailing commas.
{
    "name": "project",
    "image": "mcr.microsoft.com/devcontainers/python:3.12",
    /* features install tools into the container image */
    "features": {"ghcr.io/devcontainers/features/node:1": {},},
    "postCreateCommand": "pip install -e '.[dev]'",
    "onCreateCommand": ["npm", "install", "--prefix", "web ui"],
    "updateContentCommand": {
        "web": "npm run build",
        "api": ["make", "deps"],
    },
}
"""


def test_devcontainer_jsonc_lifecycle_commands_in_order_in_every_form(tmp_path: Path) -> None:
    write(tmp_path, ".devcontainer/devcontainer.json", DEVCONTAINER)
    declaration = found(tmp_path)
    assert declaration.source == ".devcontainer/devcontainer.json"
    assert [(step.name, step.script) for step in declaration.steps] == [
        ("onCreateCommand", "npm install --prefix 'web ui'"),
        ("updateContentCommand api", "make deps"),
        ("updateContentCommand web", "npm run build"),
        ("postCreateCommand", "pip install -e '.[dev]'"),
    ]
    assert all(step.working_directory == "." and not step.env for step in declaration.steps)
    assert any("image is not honoured" in note for note in declaration.notes)
    assert any("features is not honoured" in note for note in declaration.notes)
    assert not declaration.github_files


def test_an_array_command_runs_without_a_shell(tmp_path: Path) -> None:
    write(tmp_path, ".devcontainer.json", '{"postCreateCommand": ["echo", "$HOME; touch pwned"]}')
    (step,) = found(tmp_path).steps
    ran = subprocess.run(["bash", "-c", step.script], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert ran.stdout == "$HOME; touch pwned\n"
    assert not (tmp_path / "pwned").exists()


def test_a_devcontainer_without_commands_is_no_declaration_and_its_notes_carry_on(tmp_path: Path) -> None:
    write(tmp_path, ".devcontainer/devcontainer.json", '{"image": "python:3.12", "build": {"dockerfile": "D"}}')
    write(tmp_path, "package-lock.json", "{}")
    declaration = found(tmp_path)
    assert declaration.source == "auto (package-lock.json)"
    assert any("image is not honoured" in note for note in declaration.notes)
    assert any("build is not honoured" in note for note in declaration.notes)
    assert any("declares no command to run" in note for note in declaration.notes)


def test_openhands_setup_sh(tmp_path: Path) -> None:
    write(tmp_path, ".openhands/setup.sh", "pip install tox\n")
    declaration = found(tmp_path)
    assert (declaration.source, scripts(declaration)) == (".openhands/setup.sh", ["pip install tox\n"])


COPILOT = """\
name: "Copilot Setup Steps"
on: workflow_dispatch
env:
  WORKFLOW_LEVEL: w
  SHARED: from-workflow
jobs:
  lint:
    runs-on: ubuntu-latest
    steps:
      - run: never run
  copilot-setup-steps:
    runs-on: ubuntu-latest
    env:
      SHARED: from-job
      CI: true
      JOBS: 4
    steps:
      - name: Checkout code
        uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: "3.12"
      - name: Install
        run: |
          pip install -r requirements.txt
          echo "done" >> "$GITHUB_STEP_SUMMARY"
      - name: Frontend
        working-directory: web/app
        env:
          SHARED: from-step
        run: npm ci
"""


def test_copilot_run_steps_with_env_and_working_directory_and_uses_skipped(tmp_path: Path) -> None:
    write(tmp_path, ".github/workflows/copilot-setup-steps.yml", COPILOT)
    declaration = found(tmp_path)
    assert declaration.github_files
    install, frontend = declaration.steps
    assert install.name == "Install"
    assert install.script.startswith("set -eo pipefail\npip install -r requirements.txt\n")
    assert install.env == {"WORKFLOW_LEVEL": "w", "SHARED": "from-job", "CI": "true", "JOBS": "4"}
    assert install.working_directory == "."
    assert (frontend.working_directory, frontend.env["SHARED"], frontend.script) == (
        "web/app",
        "from-step",
        "set -eo pipefail\nnpm ci",
    )
    skipped = [note for note in declaration.notes if "is skipped" in note]
    assert len(skipped) == 2
    assert "Checkout code" in skipped[0]
    assert "actions/checkout@v4" in skipped[0]
    assert "actions/setup-python@v5" in skipped[1]


def test_a_copilot_step_fails_on_its_first_failing_command_as_on_github(tmp_path: Path) -> None:
    failing = "run: |\n          false | true\n          false\n          touch after\n"
    write(tmp_path, ".github/workflows/copilot-setup-steps.yml", COPILOT.replace("run: npm ci\n", failing))
    frontend = found(tmp_path).steps[1]
    (tmp_path / "web/app").mkdir(parents=True)
    ran = subprocess.run(["bash", "-c", frontend.script], cwd=tmp_path / "web/app", check=False)
    assert ran.returncode != 0
    assert not (tmp_path / "web/app/after").exists()


def test_copilot_job_defaults_and_unsupported_shells(tmp_path: Path) -> None:
    workflow = """\
jobs:
  copilot-setup-steps:
    defaults:
      run:
        working-directory: ./backend/
    services:
      db: {image: postgres}
    steps:
      - run: make
      - run: Write-Host hi
        shell: pwsh
      - run: ./configure
        shell: sh
        if: runner.os == 'Linux'
        working-directory: .
"""
    write(tmp_path, ".github/workflows/copilot-setup-steps.yml", workflow)
    declaration = found(tmp_path)
    assert [(step.working_directory, step.script) for step in declaration.steps] == [
        ("backend", "set -eo pipefail\nmake"),
        (".", "set -e\n./configure"),
    ]
    notes = "\n".join(declaration.notes)
    assert "services is not honoured" in notes
    assert "shell 'pwsh' is not supported" in notes
    assert "if: is not evaluated" in notes


def test_a_copilot_workflow_of_actions_only_falls_through_naming_them(tmp_path: Path) -> None:
    workflow = "jobs:\n  copilot-setup-steps:\n    steps:\n      - uses: actions/setup-node@v4\n"
    write(tmp_path, ".github/workflows/copilot-setup-steps.yml", workflow)
    write(tmp_path, "go.mod", "module example.com/x\n")
    declaration = found(tmp_path)
    assert declaration.source == "auto (go.mod)"
    assert any("actions/setup-node@v4" in note for note in declaration.notes)


WORKFLOW = ".github/workflows/copilot-setup-steps.yml"
DEVCONTAINER_FILE = ".devcontainer/devcontainer.json"


@pytest.mark.parametrize(
    ("relative", "text", "expected"),
    [
        (
            ".devcontainer/devcontainer.json",
            '{\n  "postCreateCommand": "x",\n  "a": [1,, 2]\n}',
            r"Unexpected.*\(line 3\)$",
        ),
        (".devcontainer/devcontainer.json", '["postCreateCommand"]', "not a JSON object$"),
        (".devcontainer.json", '{"postCreateCommand": 7}', "postCreateCommand must be a string"),
        (".devcontainer.json", '{"onCreateCommand": {"a": {"b": 1}}}', r"onCreateCommand\.a must be a string"),
        (
            ".github/workflows/copilot-setup-steps.yml",
            "jobs:\n  copilot-setup-steps:\n    steps: [\n",
            r"\(line \d+\)$",
        ),
        (
            ".github/workflows/copilot-setup-steps.yml",
            "jobs:\n  build:\n    steps: []\n",
            "no job named copilot-setup-steps",
        ),
        (
            ".github/workflows/copilot-setup-steps.yml",
            "jobs:\n  copilot-setup-steps:\n    steps:\n      - run: x\n        working-directory: ../../etc\n",
            "leaves the checkout",
        ),
        (
            ".github/workflows/copilot-setup-steps.yml",
            "jobs:\n  copilot-setup-steps:\n    steps:\n      - name: nothing\n",
            r"steps\[0\] has neither run:",
        ),
        (".openhands/setup.sh", "\udcff", "not UTF-8 text"),
    ],
)
def test_a_bad_file_is_one_line_naming_it(tmp_path: Path, relative: str, text: str, expected: str) -> None:
    path = tmp_path / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(DeclarationError) as caught:
        find_declaration(tmp_path, REPOSITORY, EnvironmentsSettings())
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{relative}: ")
    assert re.search(expected, message), message


def test_a_declaration_symlinked_out_of_the_checkout_is_refused_not_read(tmp_path: Path) -> None:
    outside = tmp_path / "host-secret"
    outside.write_text("TOKEN=hunter2\n")
    checkout = tmp_path / "checkout"
    (checkout / ".tasuki").mkdir(parents=True)
    (checkout / ".tasuki/setup.sh").symlink_to(outside)
    with pytest.raises(DeclarationError, match=r"^\.tasuki/setup\.sh: a symlink leading outside the checkout$"):
        find_declaration(checkout, REPOSITORY, EnvironmentsSettings())


def test_auto_one_step_per_toolchain_first_row_wins(tmp_path: Path) -> None:
    for name in ("uv.lock", "pyproject.toml", "requirements.txt", "package-lock.json", "package.json", "go.mod"):
        write(tmp_path, name, "")
    write(tmp_path, "Cargo.lock", "")
    write(tmp_path, "sub/poetry.lock", "")  # only the top of the checkout counts
    declaration = found(tmp_path)
    assert declaration.source == "auto (uv.lock, package-lock.json, go.mod, Cargo.lock)"
    assert [step.name for step in declaration.steps] == [
        "python (uv.lock)",
        "node (package-lock.json)",
        "go (go.mod)",
        "rust (Cargo.lock)",
    ]
    assert [scripts(declaration)[i] for i in (1, 3)] == ["npm ci", "cargo fetch"]
    assert scripts(declaration)[2].startswith("go mod download && ")  # then the build cache's warm-up
    assert "uv sync" in scripts(declaration)[0]
    assert "python3 -m venv .venv" in scripts(declaration)[0]


def test_auto_requirements_files_each_installed_into_the_checkouts_venv(tmp_path: Path) -> None:
    write(tmp_path, "requirements.txt", "")
    write(tmp_path, "requirements-dev.txt", "")
    (step,) = found(tmp_path).steps
    assert step.script == "python3 -m venv .venv && .venv/bin/pip install -r requirements-dev.txt -r requirements.txt"


def test_auto_is_off_when_settings_say_so(tmp_path: Path) -> None:
    write(tmp_path, "package.json", "{}")
    assert find_declaration(tmp_path, REPOSITORY, EnvironmentsSettings(auto=False)) is None
    assert found(tmp_path).steps[0].script == "npm install"


def test_auto_python_step_makes_a_venv_with_python3_not_tasukis_interpreter(tmp_path: Path) -> None:
    write(tmp_path, "requirements.txt", "# nothing to install: no index is reached\n")
    (step,) = found(tmp_path).steps
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PIP_NO_INDEX": "1"}
    subprocess.run(["bash", "-c", step.script], cwd=tmp_path, env=env, check=True, capture_output=True, timeout=120)
    ran = subprocess.run(
        [str(tmp_path / ".venv/bin/python"), "-c", "import sys; print(sys.prefix, sys.base_prefix)"],
        capture_output=True,
        text=True,
        check=True,
    )
    prefix, base = ran.stdout.split()
    assert Path(prefix) == tmp_path / ".venv"
    assert Path(base) != Path(sys.prefix)  # never Tasuki's own virtualenv


def test_the_auto_table_is_documented(tmp_path: Path) -> None:
    documentation = (ROOT / "docs/environments.md").read_text()
    section = documentation.split("## Declarations", 1)[1].split("\n## ", 1)[0]
    for row in AUTO_INSTALLS:
        for name in row.names:
            assert f"`{name}`" in section, name


def test_key_files_are_the_tables_names_at_the_top_and_the_configured_globs(tmp_path: Path) -> None:
    write(tmp_path, "uv.lock", "lock")
    write(tmp_path, "pyproject.toml", "[project]")
    write(tmp_path, "README.md", "not a key file")
    write(tmp_path, "sub/package-lock.json", "not at the top")
    write(tmp_path, "ci/tools.txt", "tool 1")
    write(tmp_path, ".git/config", "never")
    (tmp_path / "requirements.txt").symlink_to("/etc/hostname")
    settings = EnvironmentsSettings(key_files=("ci/*.txt", ".git/*", "../*"))
    assert key_files(tmp_path, settings) == {
        "uv.lock": b"lock",
        "pyproject.toml": b"[project]",
        "ci/tools.txt": b"tool 1",
    }


def test_content_changes_with_what_runs_and_not_with_the_notes() -> None:
    step = SetupStep(name="s", script="make", env={"B": "2", "A": "1"})
    base = Declaration(source="x", steps=(step,))
    assert base.content() == Declaration(source="x", steps=(step,), notes=("image is not honoured",)).content()
    reordered = SetupStep(name="s", script="make", env={"A": "1", "B": "2"})
    assert base.content() == Declaration(source="x", steps=(reordered,)).content()
    changes = [
        SetupStep(name="s", script="make all", env=step.env),
        SetupStep(name="s", script="make", env={"A": "1"}),
        SetupStep(name="s", script="make", env=step.env, working_directory="sub"),
    ]
    assert len({base.content(), *(Declaration("x", (other,)).content() for other in changes)}) == 4
    assert base.content() != Declaration("x", (step,), github_files=True).content()
    assert json.loads(base.content())["steps"][0]["script"] == "make"
