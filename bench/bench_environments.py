"""Repository environments (issue 25, SPEC §17) on a real project: itsdangerous 2.2.0's sdist from the package
index, made a git repository with a ``.tasuki/setup.sh`` that makes ``.venv`` and installs the project and its test
dependencies (pytest, freezegun, flit_core to build it) with real pip from a package index this benchmark serves
on loopback. Every task runs the project's own test suite in the bubblewrap sandbox, through the real task path
(TaskRun, the replay model over HTTP, git).

- the next tasks' restore (each into a fresh warm copy, median of 3) vs the first task's setup (target ≤ 0.1), back to
  back (a task ended, the next starts: its restore waits for the spare the last task's end began to make) and once
  the host is idle (the spare made);
- four tasks of one key started together: how many built (target 1);
- a whole task with its environment vs the same task on a host where the environment is already in place (a venv on
  the host, bound read-only; nothing set up or restored), alternating (target ≤ 1.1), twice: the next task on the
  same warm copy, which reuses the environment the previous task's restore left (unchanged: nothing copied), and a
  task in a fresh warm copy, which restores it from the snapshot (both sides then start from a fresh warm copy), and
  the task after one whose agent changed its environment (discarded, then restored from the snapshot); these two
  back to back and, in both arms, once the host is idle (the key's spare made, nothing being deleted);
- the disk one snapshot takes.

The sdist and wheels are fetched once with ``pip download`` into ``var/bench-cache/environments`` (the package
index this machine's pip is configured with); ``--quick`` uses a tiny project whose wheel it writes itself, no
network.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tarfile
import threading
import time
import uuid as uuid_module
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import Result, standalone
from bench.worker_stack import REPO_ROOT
from contexts import ContextStore
from replay import ReplayModel, serve
from replay.trajectory import turns_from_entries
from sandbox.jail import Bubblewrap, probe
from sandbox.settings import SandboxSettings
from tests.helpers.package_index import INDEX_INTERNAL, PackageIndex, make_wheel, package_index
from worker.run import TaskRequest, TaskRun
from worker.runtime import llm_config, provider_for
from worker.settings import load_settings
from worker.settings_models import Settings

CACHE = REPO_ROOT / "var" / "bench-cache" / "environments"
PROJECT = "itsdangerous==2.2.0"
TEST_DEPENDENCIES = ("pytest", "freezegun", "flit_core<4")
BASE_PYTHON = getattr(
    sys, "_base_executable", sys.executable
)  # the setup's venv is made from the interpreter Tasuki's venv came from
PIP = "pip install -q --disable-pip-version-check --no-cache-dir"
SETUP_TARGET = 0.1
WHOLE_TASK_TARGET = 1.1
TOGETHER = 4
IDLE_WAIT_S = 300.0  # for the host to be idle between tasks (a refill takes seconds)


@dataclass(frozen=True)
class Project:
    """A git repository to run tasks on, the wheels its setup installs, and the agent's test command."""

    repo: Path
    wheels: Path
    install: str  # what pip installs into .venv besides the project itself
    test: str  # run in /workspace with $VENV the environment's venv


def real_project(root: Path) -> Project | None:
    """itsdangerous from its sdist, the wheels of its tests' dependencies; None when they cannot be fetched."""
    sdists, wheels = CACHE / "sdist", CACHE / "wheels"
    if not any(sdists.glob("*.tar.gz")) or not any(wheels.glob("*.whl")):
        print("environments: fetching itsdangerous's sdist and its test dependencies once, with pip", flush=True)
        for target, arguments in (
            (sdists, ["--no-deps", "--no-binary", ":all:", PROJECT]),
            (wheels, ["--only-binary", ":all:", *TEST_DEPENDENCIES]),
        ):
            fetched = subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "-d", str(target), *arguments],
                capture_output=True,
                text=True,
                check=False,
                timeout=600,
            )
            if fetched.returncode != 0:
                print(f"environments: skipped, pip download failed: {fetched.stderr.strip()[-300:]}", flush=True)
                return None
    with tarfile.open(next(sdists.glob("*.tar.gz"))) as sdist:
        sdist.extractall(root / "sdist", filter="data")
    repo = root / "itsdangerous"
    next((root / "sdist").iterdir()).rename(repo)
    return Project(
        repo, wheels, "pytest freezegun", "PYTHONPATH=src $VENV/bin/python -m pytest -q -p no:cacheprovider tests"
    )


def tiny_project(root: Path) -> Project:
    """A one-module project and a wheel of one test dependency, written here (``--quick``: no network)."""
    repo = root / "tiny"
    (repo / "src" / "tiny").mkdir(parents=True)
    (repo / "src" / "tiny" / "__init__.py").write_text("def answer():\n    return 42\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_tiny.py").write_text(
        "import helper, tiny\n\ndef test_answer():\n    assert tiny.answer() == helper.VALUE\n"
    )
    wheels = root / "wheels"
    make_wheel(wheels, "helper", "1.0", {"helper.py": "VALUE = 42\n"})
    return Project(repo, wheels, "helper", "PYTHONPATH=src $VENV/bin/python -m unittest discover -q -s tests")


def commit_setup(project: Project, index_url: str) -> None:
    """``.tasuki/setup.sh`` that makes ``.venv`` and installs the test dependencies, committed with the project."""
    (project.repo / ".tasuki").mkdir(exist_ok=True)
    editable = "-e . " if (project.repo / "pyproject.toml").exists() else ""
    (project.repo / ".tasuki" / "setup.sh").write_text(
        f"{BASE_PYTHON} -m venv .venv\n.venv/bin/{PIP} --index-url {index_url} {editable}{project.install}\n"
    )
    for command in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "import"]):
        subprocess.run(
            ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", *command],
            cwd=project.repo,
            check=True,
            capture_output=True,
        )


@contextmanager
def served(project: Project) -> Iterator[PackageIndex]:
    """The project's wheels on a PEP 503 index on loopback (pip reads it with ``--index-url``)."""
    with package_index() as index:
        for wheel in sorted(project.wheels.glob("*.whl")):
            index.add(wheel)
        yield index


def settings_for(root: Path, model_url: str, read_only: tuple[str, ...] = (), restore: str = "auto") -> Settings:
    """Defaults, the replay model, this benchmark's directories; bubblewrap with the agent offline. With more
    ``read_only`` paths (an environment in place on the host) nothing is detected or set up."""
    config = root / "config.yaml"
    config.write_text("")
    env = {
        "TASUKI__CONTEXTS__BASE_DIR": str(root / "contexts"),
        "TASUKI__CONTEXTS__WORKSPACES_DIR": str(root / "workspaces"),
        "TASUKI__CONTEXTS__GIT_CACHE_DIR": str(root / "git-cache"),
        "TASUKI__CONTEXTS__FSYNC": "never",
        "TASUKI__LLM__PROVIDER": "openai",
        "TASUKI__LLM__OPENAI__BASE_URL": f"{model_url}/v1",
        "TASUKI__LLM__OPENAI__MODEL": "scripted",
        "TASUKI__LLM__OPENAI__CONTEXT_LENGTH": "32768",
        "TASUKI__SANDBOX__NETWORK": "none",
        "TASUKI__SANDBOX__ALLOWED_INTERNAL": json.dumps([INDEX_INTERNAL]),  # the setup's pip reaches the index
        "TASUKI__SANDBOX__READ_ONLY_PATHS": json.dumps([sys.base_prefix, *read_only]),
        "TASUKI__ENVIRONMENTS__AUTO": "false" if read_only else "true",
        "TASUKI__ENVIRONMENTS__RESTORE": restore,
    }
    return load_settings(config_path=config, env=env)


def one_task(
    root: Path,
    project: Project,
    repo: Path,
    venv: str,
    read_only: tuple[str, ...] = (),
    before: str = "",
    restore: str = "auto",
) -> tuple[float, dict[str, Any]]:
    """Seconds of one whole task that runs the project's tests with ``venv`` (after the shell command ``before``);
    and its setup record (or {})."""
    command = before + project.test.replace("$VENV", venv)
    turns = [
        {"content": "Run the tests.", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
        {"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"summary": "ran the tests"}}]},
    ]
    server = serve(ReplayModel(turns_from_entries(turns)))
    try:
        settings = settings_for(root, server.url, read_only, restore)
        uuid = str(uuid_module.uuid4())
        request = TaskRequest(
            {"task_source": "local", "owner": "local", "repo": repo.name, "task_type": "prompt", "task_id": uuid[:8]},
            prompt="Run the tests.",
            repo_path=str(repo),
        )
        store = ContextStore(settings.contexts.base_dir, fsync="never")
        started = time.perf_counter()
        outcome = TaskRun(
            uuid, request, settings, store, provider_for=lambda config: provider_for(config, settings)
        ).execute(llm_config(settings))
        seconds = time.perf_counter() - started
    finally:
        server.stop()
    directory = store.completed_path(uuid)
    tools = [json.loads(line) for line in (directory / "tools.jsonl").read_text().splitlines() if line.strip()]
    tests = next(str(r.get("result", "")) for r in tools if r["tool_name"] == "bash")
    setup = next((r.get("result") or {} for r in tools if r["tool_name"] == "setup"), {})
    if outcome["status"] != "completed" or "exit code: 0" not in tests:
        raise RuntimeError(f"environments: a task did not pass its tests ({outcome['status']}, environment "
                           f"{setup.get('line')}; {setup.get('log_tail', '')[-300:]}): {tests[-300:]}")
    return seconds, setup


def clone_as(project: Project, name: str, root: Path, *, declared: bool = True) -> Path:
    """The project's repository under another name (another repository: another key); without its setup when not
    ``declared``."""
    target = root / name
    subprocess.run(["git", "clone", "-q", str(project.repo), str(target)], check=True, capture_output=True)
    if not declared:
        for command in (["rm", "-q", "-r", ".tasuki"], ["commit", "-q", "-m", "no setup"]):
            subprocess.run(
                ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", *command],
                cwd=target,
                check=True,
                capture_output=True,
            )
    return target


def host_venv(root: Path, project: Project, index_url: str) -> Path:
    """The environment already in place on a host: the same install, made once outside any task."""
    venv = root / "host-env" / ".venv"
    subprocess.run([BASE_PYTHON, "-m", "venv", str(venv)], check=True, capture_output=True)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", *PIP.split(), "--index-url", index_url, *project.install.split()],
        check=True,
        capture_output=True,
    )
    return venv


def fresh_warm_copies(root: Path) -> None:
    """No warm copy is left: the next task of every repository starts from a new one (and restores its environment
    from the snapshot)."""
    shutil.rmtree(root / "workspaces" / ".idle", ignore_errors=True)


def host_idle(root: Path, key: str, spare: bool) -> None:
    """Wait (at most IDLE_WAIT_S) until the host does nothing for the tasks before: the key's spare is made (when
    ``spare``: restores copy) and no environment an agent changed is still being deleted."""
    spares, workspaces = root / "environments" / ".spares", root / "workspaces"
    deadline = time.monotonic() + IDLE_WAIT_S
    while not (
        ((spares / key).is_dir() or not spare)
        and not any(spares.glob(".building-*"))
        and not any(workspaces.glob(".discarded-*"))
    ):
        if time.monotonic() > deadline:
            raise RuntimeError(f"environments: the host was not idle after {IDLE_WAIT_S:.0f} s")
        time.sleep(0.05)


def whole_tasks(
    root: Path,
    project: Project,
    plain: Path,
    in_place: Path,
    rounds: int,
    *,
    fresh: bool,
    changed: bool = False,
    idle: str | None = None,
    restore: str = "auto",
) -> tuple[float, float, list[str]]:
    """Medians of ``rounds`` whole tasks with the snapshot's environment and with it in place, alternating (each in a
    fresh warm copy when ``fresh``; after a task whose agent changed its environment, untimed, when ``changed``;
    each, in both arms, once the host is idle when ``idle`` names the key, else back to back); and the outcomes of
    the former's environment."""
    times: dict[str, list[float]] = {"snapshot": [], "in place": []}
    outcomes = []
    for _ in range(rounds):
        if fresh:
            fresh_warm_copies(root)
        if changed:
            one_task(
                root, project, project.repo, ".venv", before="touch .venv/changed-by-the-agent && ", restore=restore
            )
        if idle is not None:
            host_idle(root, idle, spare=restore == "copy")
        seconds, setup = one_task(root, project, project.repo, ".venv", restore=restore)
        times["snapshot"].append(seconds)
        outcomes.append(described(setup))
        if fresh:
            fresh_warm_copies(root)
        if idle is not None:
            host_idle(root, idle, spare=restore == "copy")
        times["in place"].append(one_task(root, project, plain, str(in_place), (str(in_place.parent),))[0])
    return statistics.median(times["snapshot"]), statistics.median(times["in place"]), outcomes


def described(setup: dict[str, Any]) -> str:
    """A setup's outcome, and how a restore was made: the key's spare moved into place ("restored+spare"), or by
    layers ("restored+layers"; else it was copied)."""
    how = "+spare" if setup.get("spare") else "+layers" if setup.get("layers") else ""
    return f"{setup.get('outcome')}{how}"


def disk_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (their apparent sizes)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def restored_rows(root: Path, project: Project, plain: Path, in_place: Path, rounds: int, key: str) -> list[Result]:
    """The whole task restored vs in place: after an agent changed the environment and in a fresh warm copy, back to
    back and once the host is idle; and in a fresh warm copy back to back by copy, for comparison."""
    restored: list[Result] = []  # the whole task restored vs in place, per case and arrival
    for label, case, fresh, changed in (
        ("its agent changed it",
         "after its warm copy's previous agent changed the environment (discarded, restored from the snapshot)",
         False, True),
        ("fresh warm copy", "in a fresh warm copy, environment restored from the snapshot", True, False),
    ):
        for idle in (False, True):
            snapshot_task, in_place_task, outcomes = whole_tasks(
                root, project, plain, in_place, rounds, fresh=fresh, changed=changed, idle=key if idle else None
            )
            figure = snapshot_task / in_place_task
            arrival = (
                "each task once the host is idle (its spare made, nothing being deleted), in both arms"
                if idle else "back to back"
            )
            print(
                f"environments: whole task {case} {snapshot_task:.2f} s vs already in place {in_place_task:.2f} "
                f"s, ratio {figure:.2f} ({arrival}; median of {rounds}, alternating; outcomes {outcomes})",
                flush=True,
            )
            restored.append(
                Result(
                    f"whole task, env restored ({label}, {'host idle' if idle else 'back to back'}) vs in place",
                    f"{figure:.2f}",
                    f"<= {WHOLE_TASK_TARGET}",
                    figure <= WHOLE_TASK_TARGET,
                )
            )
    # The same fresh-warm-copy case back to back with restores by copy (environments.restore: copy), for
    # comparison: the spare the last task's end began to make is what the next restore waits for.
    copy_task, in_place_task, outcomes = whole_tasks(
        root, project, plain, in_place, rounds, fresh=True, restore="copy"
    )
    by_copy = copy_task / in_place_task
    print(
        f"environments: whole task in a fresh warm copy, environment restored by copy {copy_task:.2f} s vs "
        f"already in place {in_place_task:.2f} s, ratio {by_copy:.2f} (back to back; median of {rounds}, "
        f"alternating; outcomes {outcomes})",
        flush=True,
    )
    restored.append(
        Result("whole task, env restored by copy (fresh warm copy, back to back) vs in place", f"{by_copy:.2f}",
               "", None)
    )
    host_idle(root, key, spare=True)  # the last copy's spare is made in the background: not beside the clean-up
    return restored


def run(root: Path, *, quick: bool = False) -> list[Result]:
    """Setup vs restore, one build for four tasks, a restored task vs one with the environment in place."""
    problem = probe(Bubblewrap(SandboxSettings()))
    if problem is not None:
        print(f"environments: skipped, {problem}", flush=True)
        return []
    project = tiny_project(root) if quick else real_project(root)
    if project is None:
        return []
    name = "a tiny project" if quick else "itsdangerous 2.2.0 (sdist)"
    with served(project) as index:
        url = index.url
        commit_setup(project, url)
        _, built = one_task(root, project, project.repo, ".venv")
        setup_s = float(built["duration_s"])
        key = str(built["key"])
        ratios: dict[str, float] = {}
        layered = True  # known after the first restore (auto: layers where this host's probe passes)
        for arrival in ("back to back", "once the host is idle"):
            restores = []
            for _ in range(1 if quick else 3):
                fresh_warm_copies(root)  # else the next task reuses what the last one left, copying nothing
                if arrival != "back to back":
                    host_idle(root, key, spare=not layered)
                restores.append(one_task(root, project, project.repo, ".venv")[1])
                layered = bool(restores[0].get("layers"))
            outcomes = [built.get("outcome"), *(restored.get("outcome") for restored in restores)]
            if outcomes != ["built"] + ["restored"] * len(restores):
                raise RuntimeError(f"environments: expected built then restored, got {outcomes}")
            restore_s = statistics.median(float(restored["duration_s"]) for restored in restores)
            ratios[arrival] = restore_s / setup_s
            print(
                f"environments: {name}: first task's setup {setup_s:.2f} s, the next tasks' restore (each in a fresh "
                f"warm copy, {arrival}) {restore_s:.2f} s (median of {len(restores)}; "
                f"{[described(r) for r in restores]}), ratio {ratios[arrival]:.3f}",
                flush=True,
            )

        outcomes: list[str] = []
        together = clone_as(project, "together", root)
        threads = [
            threading.Thread(
                target=lambda: outcomes.append(str(one_task(root, project, together, ".venv")[1].get("outcome")))
            )
            for _ in range(TOGETHER)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        builds = outcomes.count("built")
        print(
            f"environments: {TOGETHER} tasks of one key started together: {builds} built, "
            f"{outcomes.count('restored')} restored",
            flush=True,
        )

        in_place = host_venv(root, project, url)
        plain = clone_as(project, "plain", root, declared=False)  # nothing declared, nothing detected: no setup
        rounds = 1 if quick else 7
        one_task(root, project, project.repo, ".venv")  # the warm copy holds the environment from here on
        reused_task, in_place_task, outcomes = whole_tasks(root, project, plain, in_place, rounds, fresh=False)
        reused = reused_task / in_place_task
        print(
            f"environments: whole task, environment reused on the same warm copy {reused_task:.2f} s vs already in "
            f"place {in_place_task:.2f} s, ratio {reused:.2f} (median of {rounds}, alternating; outcomes {outcomes})",
            flush=True,
        )
        restored = restored_rows(root, project, plain, in_place, rounds, key)
    snapshots = list((root / "environments").rglob("manifest.json"))
    sizes = [disk_bytes(p.parent) for p in snapshots]
    size = statistics.median(sizes) / 2**20 if sizes else 0.0
    spares = [disk_bytes(p) for p in (root / "environments" / ".spares").glob("*")]
    print(
        f"environments: {len(sizes)} snapshots on disk, {size:.1f} MiB each (median); {len(spares)} spares, "
        f"{sum(spares) / 2**20:.1f} MiB in all",
        flush=True,
    )
    return [
        *(
            Result(f"environment restore vs setup ({name}, {arrival.removeprefix('once the ')})", f"{ratio:.3f}",
                   f"<= {SETUP_TARGET}", ratio <= SETUP_TARGET)
            for arrival, ratio in ratios.items()
        ),
        Result(f"builds of {TOGETHER} tasks of one key started together", str(builds), "1", builds == 1),
        Result(
            "whole task, env on its warm copy's next task vs in place",
            f"{reused:.2f}",
            f"<= {WHOLE_TASK_TARGET}",
            reused <= WHOLE_TASK_TARGET,
        ),
        *restored,
        Result("disk per snapshot (MiB)", f"{size:.1f}", "", None),
    ]


if __name__ == "__main__":
    standalone(run, __doc__)
