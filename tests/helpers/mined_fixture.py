"""The mined itsdangerous fixture (issue 39): pallets/itsdangerous's history up to 3d3dc9f as a git bundle, and the
set ``tasuki eval mine`` made of it — for the miner's tests, the eval runner's and the benchmark.

Mining needs pytest and freezegun in the sandbox, offline: a local package index serves wheels of this virtualenv's
own installed distributions (tests/helpers/installed_wheels.py), reached by the setup through its egress proxy
(``sandbox.allowed_internal``) at the ``PIP_INDEX_URL`` that ``environments.setup_secrets`` passes to the setup.

Make the fixture again: ``.venv/bin/python -m tests.helpers.mined_fixture`` (it runs the command ``mine_command``
returns, with ``--out tests/fixtures/evals/itsdangerous.jsonl``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.helpers.installed_wheels import FREEZEGUN_AND_DEPENDENCIES, PYTEST_AND_DEPENDENCIES, serve_installed
from tests.helpers.package_index import INDEX_INTERNAL, package_index

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "evals"
BUNDLE = FIXTURES / "itsdangerous.bundle"
SET = FIXTURES / "itsdangerous.jsonl"
REPO = "pallets/itsdangerous"
LIMIT = 4
SETUP = "python3 -m venv .venv && .venv/bin/pip install -q --disable-pip-version-check pytest freezegun"
# The package's own build backend (flit) is not served: the tests import it from src/ instead of an install.
TEST_COMMAND = 'PYTHONPATH=src "$py" -m pytest -rA -p no:cacheprovider {files}'


def clone_bundle(into: Path) -> Path:
    """A clone of the bundle (its ``main`` at 3d3dc9f) at ``into``."""
    subprocess.run(["git", "clone", "-q", str(BUNDLE), str(into)], check=True, capture_output=True)
    return into


@contextmanager
def mining_environment(wheels: Path) -> Iterator[dict[str, str]]:
    """A package index serving pytest and freezegun while the block runs; the variables that let a mining setup
    reach it."""
    with package_index() as index:
        serve_installed(index, wheels, PYTEST_AND_DEPENDENCIES + FREEZEGUN_AND_DEPENDENCIES)
        yield {"TASUKI__SANDBOX__ALLOWED_INTERNAL": json.dumps([INDEX_INTERNAL]),
               "TASUKI__ENVIRONMENTS__SETUP_SECRETS": json.dumps(["PIP_INDEX_URL"]), "PIP_INDEX_URL": index.url}


def mine_command(source: Path | str, *extra: str) -> list[str]:
    """``tasuki eval mine`` of the fixture's repository, as the fixture was made (``extra`` appended)."""
    return ["eval", "mine", str(source), "--repo", REPO, "--limit", str(LIMIT), "--no-forge", "--setup", SETUP,
            "--test-command", TEST_COMMAND, *extra]


def tasuki_env(directory: Path, extra: dict[str, str]) -> dict[str, str]:
    """The process environment of a ``tasuki`` subprocess with an empty config under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.yaml").write_text("")
    env = {key: value for key, value in os.environ.items() if not key.startswith("TASUKI")}
    env.update({"TASUKI_CONFIG": str(directory / "config.yaml"), "TASUKI__LOCAL__VAR_DIR": str(directory / "var"),
                "TASUKI__CONTEXTS__BASE_DIR": str(directory / "contexts"), **extra})
    return env


def run_tasuki(args: Sequence[str], env: dict[str, str], timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -m cli.main ARGS`` from the project's root."""
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout_s, check=False)


def main() -> int:
    """Make the fixture set again from the bundle."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch, mining_environment(Path(scratch) / "wheels") as served:
        source = clone_bundle(Path(scratch) / "itsdangerous")
        done = run_tasuki(mine_command(source, "--out", str(SET)), tasuki_env(Path(scratch) / "home", served))
        sys.stderr.write(done.stderr)
        return done.returncode


if __name__ == "__main__":
    sys.exit(main())
