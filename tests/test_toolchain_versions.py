"""Whether the worker's toolchains are new enough for a repository (issue 41, sandbox/toolchain_versions.py): the
versions real projects' manifests ask for, the versions the machine's real toolchains answer with, a shortfall told in
the environment's line and the agent's first message, go never fetching a toolchain of the repository's choosing, and
the automatic Go setup leaving a warm build cache in the snapshot for the next task."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.tools import Workspace, run_tool
from cli.environment_view import environment_line
from contexts import ContextStore
from sandbox.host import HOST_ENV
from sandbox.jail import make_sandbox
from sandbox.toolchain_versions import Wanted, installed, shortfalls, version_text, wanted
from sandbox.toolchains import worker_path
from tests.helpers.ci import bubblewrap_here
from tests.helpers.stack import git
from tests.test_environment_resume import TASK_KEY, checkout_for
from worker.checkout import Checkout
from worker.environment import TaskEnvironment
from worker.settings_models import Settings

REAL = Path(__file__).parent / "fixtures" / "toolchains"  # manifests of real projects (SOURCES there)
GO_MOD = "module example.com/calc\n\ngo 1.21\n"
GO_CALC = "package calc\n\nfunc Add(a, b int) int { return a + b }\n"
GO_TEST = (
    'package calc\n\nimport "testing"\n\n'
    'func TestAdd(t *testing.T) {\n\tif Add(2, 3) != 5 {\n\t\tt.Fatal("sum")\n\t}\n}\n'
)


def needs(program: str) -> None:
    if shutil.which(program, path=os.pathsep.join(worker_path())) is None:
        pytest.skip(f"{program} is not installed on this machine (the compose tests run it in the image)")


@pytest.mark.parametrize(
    ("project", "expected"),
    [
        ("go-cmp", Wanted("go", (1, 21), "go.mod: go 1.21")),
        ("dotenv", Wanted("node", (12,), 'package.json: engines.node ">=12"')),
        ("rustc-hash", Wanted("rust", (1, 77), 'Cargo.toml: rust-version "1.77"')),
        ("javapoet", Wanted("java", (8,), "pom.xml: <java.version>1.8")),
    ],
)
def test_real_projects_manifests_name_the_version_they_ask_for(project: str, expected: Wanted) -> None:
    assert wanted(REAL / project) == [expected]


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("go.mod", "module x\n\ngo 1.22.0\n\ntoolchain go1.23.4\n", ("go", (1, 22, 0))),
        (".nvmrc", "v20.11.0\n", ("node", (20, 11, 0))),
        (".node-version", "22\n", ("node", (22,))),
        (".nvmrc", "lts/*\n", None),
        ("package.json", '{"engines": {"node": "^20.9.0 || >=22"}}', ("node", (20, 9, 0))),
        ("package.json", '{"engines": {"node": "<20"}}', None),
        ("package.json", '{"engines": "node 20"}', None),
        ("rust-toolchain.toml", '[toolchain]\nchannel = "1.80.0"\n', ("rust", (1, 80, 0))),
        ("rust-toolchain", "stable\n", None),
        ("Cargo.toml", '[package]\nname = "x"\nedition = "2024"\n', ("rust", (1, 85))),
        ("build.gradle.kts", "java { toolchain { languageVersion = JavaLanguageVersion.of(21) } }", ("java", (21,))),
        ("build.gradle", "sourceCompatibility = JavaVersion.VERSION_11\n", ("java", (11,))),
        ("pom.xml", "<properties><maven.compiler.release>21</maven.compiler.release></properties>", ("java", (21,))),
        (".java-version", "17\n", ("java", (17,))),
        ("pyproject.toml", '[project]\nname = "x"\nrequires-python = ">=3.12"\n', ("python", (3, 12))),
        (".python-version", "3.13.1\n", ("python", (3, 13))),
        ("Cargo.toml", "[package\nbroken", None),
        ("package.json", "{not json", None),
    ],
)
def test_each_file_a_repository_states_its_version_in_is_read(
    tmp_path: Path, name: str, text: str, expected: tuple[str, tuple[int, ...]] | None
) -> None:
    (tmp_path / name).write_text(text)
    found = [(want.toolchain, want.minimum) for want in wanted(tmp_path)]
    assert found == ([expected] if expected else [])


def test_a_repositorys_links_pipes_and_huge_files_are_never_followed_waited_on_or_read_whole(tmp_path: Path) -> None:
    outside = tmp_path / "host-file"
    outside.write_text("module x\n\ngo 99.0\n")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "go.mod").symlink_to(outside)  # a link out of the checkout: not read
    os.mkfifo(checkout / "package.json")  # a named pipe: never waited on
    (checkout / "Cargo.toml").write_text("# padding\n" * 40_000 + '[package]\nrust-version = "99.0"\n')  # past the cap
    deep = tmp_path / "deep"
    deep.mkdir()  # nested past Python's stack, within the size cap: no version, never a crash of the worker
    (deep / "package.json").write_text('{"engines": ' + "[" * 100_000 + "]" * 100_000 + "}")
    (deep / "pyproject.toml").write_text("project = " + "[" * 100_000 + "]" * 100_000 + "\n")
    assert wanted(deep) == []
    found: list[Wanted] = []
    reader = threading.Thread(target=lambda: found.extend(wanted(checkout)), daemon=True)
    reader.start()
    reader.join(timeout=30)
    assert not reader.is_alive(), "reading the checkout's manifests blocked on a named pipe"
    assert found == []


@pytest.mark.parametrize(
    ("toolchain", "truth"),
    [
        ("go", ["go", "env", "GOVERSION"]),
        ("node", ["node", "-p", "process.versions.node"]),
        ("rust", ["rustc", "-vV"]),
        ("java", ["java", "-XshowSettings:properties", "-version"]),
        ("python", ["python3", "-c", "import sys; print('.'.join(map(str, sys.version_info[:3])))"]),
    ],
)
def test_the_machines_real_toolchains_answer_with_their_versions(toolchain: str, truth: list[str]) -> None:
    needs(truth[0])
    path = worker_path()
    done = subprocess.run(truth, cwd="/", env={**HOST_ENV, "PATH": os.pathsep.join(path), "GOTOOLCHAIN": "local"},
                          capture_output=True, text=True, timeout=60, check=True)
    said = done.stdout + done.stderr
    version = installed(toolchain, path)
    assert version is not None
    if toolchain == "java":  # the JVM's specification version is the JDK's major
        assert f"java.specification.version = {version[0]}" in said
    else:
        assert version_text(version) in said


def test_a_version_the_worker_lacks_is_told_with_the_version_it_has(tmp_path: Path) -> None:
    needs("node")
    (tmp_path / "package.json").write_text('{"engines": {"node": ">=99"}}')
    have = installed("node", worker_path())
    assert have is not None
    assert shortfalls(tmp_path, worker_path()) == [
        f'package.json: engines.node ">=99" asks for node ≥ 99; the worker\'s node is {version_text(have)}: '
        'the worker\'s image needs a newer one (docs/environments.md, "Toolchains")'
    ]
    assert shortfalls(tmp_path, ["/nonexistent"])[0].endswith(
        'and the worker has no node: the worker\'s image needs a newer one (docs/environments.md, "Toolchains")'
    )
    (tmp_path / "package.json").write_text(f'{{"engines": {{"node": ">={have[0]}"}}}}')
    assert shortfalls(tmp_path, worker_path()) == []


def _repository(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "a project")
    return path


def _inside(settings: Settings, checkout: Checkout, command: str, home: Path | None = None) -> str:
    """What ``command`` prints run by the agent's own bash tool in the task's sandbox (``home``: another home)."""
    result = run_tool(Workspace(checkout.path), "bash", {"command": command}, bash_timeout_s=600,
                      max_output_chars=20000, sandbox=make_sandbox(settings.sandbox, read_only=checkout.shared_paths),
                      limits=settings.sandbox.limits, home=home or checkout.home)
    return result.output


def test_a_shortfall_is_in_the_environments_line_and_the_agents_first_message(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    needs("node")
    bubblewrap_here()
    settings = make_settings()
    remote = _repository(tmp_path / "repo", {".tasuki/setup.sh": "true\n",
                                             "package.json": '{"name": "x", "engines": {"node": ">=99"}}'})
    store = ContextStore(settings.contexts.base_dir, fsync="never")
    ctx = store.create(TASK_KEY, {})
    checkout = checkout_for(settings, remote, ctx.uuid)
    report = TaskEnvironment(settings, str(remote)).prepare(ctx, checkout)
    assert report.outcome == "built", report.log_tail
    line = 'package.json: engines.node ">=99" asks for node ≥ 99; the worker\'s node is '
    assert len(report.toolchains) == 1
    assert report.toolchains[0].startswith(line)
    assert report.first_message() == f"Note: {report.toolchains[0]}"
    environment = ctx.read_state()["environment"]
    assert environment["toolchains"] == list(report.toolchains)
    assert environment_line(environment).startswith("built in ")
    assert line in environment_line(environment)
    checkout.release()
    ctx.release()


def test_go_never_fetches_a_toolchain_the_repository_names(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    needs("go")
    bubblewrap_here()
    settings = make_settings()
    remote = _repository(tmp_path / "repo", {"go.mod": "module x\n\ngo 1.21\n\ntoolchain go1.99.0\n",
                                             "newer/go.mod": "module y\n\ngo 1.99\n", "newer/y.go": "package y\n"})
    store = ContextStore(settings.contexts.base_dir, fsync="never")
    ctx = store.create(TASK_KEY, {})
    checkout = checkout_for(settings, remote, ctx.uuid)
    local = installed("go", worker_path())
    assert local is not None
    said = _inside(settings, checkout, "go env GOTOOLCHAIN; go version; cd newer && go build ./...")
    assert said.splitlines()[0] == "local"
    assert f"go version go{version_text(local)} " in said  # the worker's go, not go1.99.0
    assert re.search(r"requires go >= 1\.99 \(running go [\d.]+; GOTOOLCHAIN=local\)", said), said
    checkout.release()
    ctx.release()


def test_the_automatic_go_setup_leaves_a_warm_build_cache_for_the_next_task(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    needs("go")
    bubblewrap_here()
    settings = make_settings()
    remote = _repository(tmp_path / "repo", {"go.mod": GO_MOD, "calc.go": GO_CALC, "calc_test.go": GO_TEST})
    store = ContextStore(settings.contexts.base_dir, fsync="never")
    first = store.create(TASK_KEY, {})
    checkout = checkout_for(settings, remote, first.uuid)
    built = TaskEnvironment(settings, str(remote)).prepare(first, checkout)
    assert (built.outcome, built.source) == ("built", "auto (go.mod)"), built.log_tail
    checkout.release()
    first.release()

    second = store.create({**TASK_KEY, "task_id": "2"}, {})
    checkout = checkout_for(settings, remote, second.uuid)
    restored = TaskEnvironment(settings, str(remote)).prepare(second, checkout)
    assert restored.outcome in ("restored", "reused"), restored
    compiles = "echo compiles=$(go test -count=1 -x ./... 2>&1 | grep -c '/compile ')"
    warm = _inside(settings, checkout, compiles)
    empty_home = tmp_path / "empty-home"
    empty_home.mkdir(mode=0o700)
    cold = _inside(settings, checkout, compiles, home=empty_home)
    assert "compiles=0\n" in warm, warm  # the standard library and the package: all cached
    cold_count = re.search(r"compiles=(\d+)", cold)
    assert cold_count is not None, cold
    assert int(cold_count.group(1)) > 0, cold  # the same command with no cache compiles them
    checkout.release()
    second.release()
