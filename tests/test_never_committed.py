"""What an install leaves in the checkout is never committed nor pushed, and a task that changed nothing pushes
nothing (SPEC §17 "Never committed").

Real git with bare remotes (a hook on the remote records every commit pushed to it, checkpoints included), the
agent's commands run by the real worker code in bubblewrap, the scripted model over HTTP, and the fake forge
over real HTTP."""

from __future__ import annotations

import subprocess
import uuid as uuid_module
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.commands import outcome_lines
from contexts import ContextStore
from replay import ReplayModel, serve
from replay.trajectory import turns_from_entries
from tests.helpers.fake_forge import FakeForge
from tests.helpers.stack import BUGGY_CALC, FIXED_CALC, git, make_buggy_repo
from tests.helpers.worker_scenarios import finish_turn, provider_env, tool
from worker.checkout import Checkout, GitError
from worker.forges import GitHubForge
from worker.forges.reporter import ForgeReporter
from worker.leftout import LeftOut, NeverCommitted, anchored
from worker.run import TaskRequest, TaskRun
from worker.runtime import provider_for
from worker.settings_models import LabelSettings, Settings
from worker.user_config import llm_config

TOKEN = "never-committed-forge-token"
OWNER, REPO = "team", "calc"
MB = 1024 * 1024
LABELS = LabelSettings()

# The remote's hook: every commit pushed to it (task branch and checkpoints), as "ref path" lines per file.
RECORD_PUSHES = """#!/bin/sh
ref="$1"; new="$3"
case "$new" in 0000000000000000000000000000000000000000) exit 0;; esac
git ls-tree -r --name-only "$new" | sed "s|^|$ref |" >> "{log}"
"""


def bare_remote(tmp_path: Path, source: Path | None = None) -> Path:
    """A bare clone of ``source`` (the buggy calc repository by default) that records every push."""
    source = source or make_buggy_repo(tmp_path / "source")
    bare = tmp_path / "remote.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(source), str(bare)], check=True, capture_output=True)
    record(bare)
    return bare


def record(bare: Path) -> Path:
    log = bare / "pushed.log"
    hook = bare / "hooks" / "update"
    hook.write_text(RECORD_PUSHES.format(log=log))
    hook.chmod(0o755)
    log.touch()
    return log


def pushed(bare: Path) -> list[tuple[str, str]]:
    """(ref, path) of every file of every commit pushed to ``bare``."""
    lines = (bare / "pushed.log").read_text().splitlines()
    return [(ref, path) for ref, path in (line.split(" ", 1) for line in lines)]


def branches(bare: Path) -> set[str]:
    return set(git(bare, "for-each-ref", "--format=%(refname:short)", "refs/heads").split())


def files_on(bare: Path, branch: str) -> set[str]:
    return set(git(bare, "ls-tree", "-r", "--name-only", branch).split())


def install(checkout: Checkout) -> None:
    """What an install leaves: a virtualenv and node_modules with files, byte-code beside the sources."""
    for n in range(12):
        path = checkout.path / ".venv" / "lib" / "site-packages" / f"m{n}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# module {n}\n")
    (checkout.path / "node_modules" / "left-pad").mkdir(parents=True)
    (checkout.path / "node_modules" / "left-pad" / "index.js").write_text("module.exports = 1;\n")
    (checkout.path / "__pycache__").mkdir()
    (checkout.path / "__pycache__" / "calc.cpython-311.pyc").write_bytes(b"\0" * 64)


# -- the checkout --------------------------------------------------------------------------------------------


def test_an_install_is_in_neither_a_checkpoint_nor_the_pushed_commit_and_the_summary_names_it(
    tmp_path: Path,
) -> None:
    bare = bare_remote(tmp_path)
    work = Checkout(tmp_path / "work", str(bare), "tasuki/1-venv0000")
    work.prepare(fresh=True)
    install(work)
    (work.path / "calc.py").write_text(FIXED_CALC)
    assert work.checkpoint(1)
    work.settle()
    assert work.commit("fix add")
    work.push()

    assert files_on(bare, "tasuki/1-venv0000") == {"calc.py", "test_calc.py"}
    refs = {ref for ref, _ in pushed(bare)}
    assert "refs/heads/tasuki-checkpoints/1-venv0000" in refs  # the checkpoint was pushed: it was checked too
    assert {path for _, path in pushed(bare)} == {"calc.py", "test_calc.py"}
    assert work.left_out().describe() == (
        "left out of the commit: .venv/ (12 files), __pycache__/ (1 file), node_modules/ (1 file)"
    )


def test_a_file_over_the_limit_is_left_out_and_named_and_a_tracked_one_that_grew_keeps_its_version(
    tmp_path: Path,
) -> None:
    source = make_buggy_repo(tmp_path / "source")
    (source / "assets").mkdir()
    (source / "assets" / "logo.bin").write_bytes(b"\1" * 1000)
    git(source, "add", "-A")
    git(source, "commit", "-qm", "a small asset")
    bare = bare_remote(tmp_path, source)
    work = Checkout(tmp_path / "work", str(bare), "tasuki/2-big00000")
    work.prepare(fresh=True)
    (work.path / "data.bin").write_bytes(b"\0" * (6 * MB))  # ignored by nothing: only the size keeps it out
    (work.path / "assets" / "logo.bin").write_bytes(b"\2" * (7 * MB))
    (work.path / "calc.py").write_text(FIXED_CALC)
    assert work.checkpoint(1)
    work.settle()
    assert work.commit("fix add")
    work.push()

    assert files_on(bare, "tasuki/2-big00000") == {"calc.py", "test_calc.py", "assets/logo.bin"}
    assert git(bare, "cat-file", "-s", "tasuki/2-big00000:assets/logo.bin").strip() == "1000"  # as committed before
    assert "data.bin" not in {path for _, path in pushed(bare)}
    assert work.left_out().describe() == (
        "left out of the commit: assets/logo.bin (7 MB > 5 MB), data.bin (6 MB > 5 MB)"
    )
    assert (work.path / "data.bin").stat().st_size == 6 * MB  # left out of git, not deleted


def test_a_large_file_the_agent_staged_itself_is_still_left_out(tmp_path: Path) -> None:
    bare = bare_remote(tmp_path)
    work = Checkout(tmp_path / "work", str(bare), "tasuki/3-staged00", never=NeverCommitted(max_file_bytes=1000))
    work.prepare(fresh=True)
    (work.path / "dump.sql").write_text("x" * 2000)
    (work.path / "notes.txt").write_text("small\n")
    git(work.path, "add", "dump.sql")  # the agent's own `git add`, in its index
    assert work.commit("notes")
    assert set(work.git("ls-tree", "-r", "--name-only", "HEAD").split()) == {"calc.py", "test_calc.py", "notes.txt"}
    assert work.left_out().describe() == "left out of the commit: dump.sql (2 KB > 1000 bytes)"


def test_a_tracked_file_under_a_never_committed_pattern_is_still_committed_when_it_changes(tmp_path: Path) -> None:
    source = make_buggy_repo(tmp_path / "source")
    (source / "node_modules" / "vendored").mkdir(parents=True)
    (source / "node_modules" / "vendored" / "index.js").write_text("v1\n")
    git(source, "add", "-A")
    git(source, "commit", "-qm", "a vendored module, tracked on purpose")
    bare = bare_remote(tmp_path, source)
    work = Checkout(tmp_path / "work", str(bare), "tasuki/4-tracked0")
    work.prepare(fresh=True)
    (work.path / "node_modules" / "vendored" / "index.js").write_text("v2\n")
    (work.path / "node_modules" / "installed").mkdir()
    (work.path / "node_modules" / "installed" / "index.js").write_text("from the registry\n")
    assert work.commit("update the vendored module")
    work.push()

    assert git(bare, "show", "tasuki/4-tracked0:node_modules/vendored/index.js") == "v2\n"
    assert "node_modules/installed/index.js" not in files_on(bare, "tasuki/4-tracked0")


def test_exclude_writes_anchored_patterns_once_and_they_keep_those_paths_alone_out(tmp_path: Path) -> None:
    bare = bare_remote(tmp_path)
    work = Checkout(tmp_path / "work", str(bare), "tasuki/5-exclude0")
    work.prepare(fresh=True)
    created = ["build/", "./cache.db", "odd[1]*.txt"]
    work.exclude(created)
    work.exclude(created)  # the setup runs again on a resume: nothing doubled
    lines = (work.path / ".git" / "info" / "exclude").read_text().splitlines()
    assert [line for line in lines if not line.startswith("#")] == [
        *NeverCommitted().patterns,
        "/build/",
        "/cache.db",
        "/odd\\[1]\\*.txt",
    ]
    for name in ("build/out.o", "cache.db", "odd[1]*.txt", "odd1x.txt", "sub/cache.db", "sub/build/keep.txt"):
        (work.path / name).parent.mkdir(parents=True, exist_ok=True)
        (work.path / name).write_text(name)
    assert work.commit("files")
    committed = set(work.git("ls-tree", "-r", "--name-only", "HEAD").split())
    # Anchored and literal: only the setup's own paths are left out, not their namesakes elsewhere.
    assert committed - {"calc.py", "test_calc.py"} == {"odd1x.txt", "sub/cache.db", "sub/build/keep.txt"}
    assert work.left_out().describe() == "left out of the commit: build/ (1 file), cache.db, odd[1]*.txt"


def test_anchored_paths() -> None:
    assert anchored("./a/b/") == "/a/b/"
    assert anchored("/abs") == "/abs"
    assert anchored("#notes") == "/#notes"
    assert anchored("trailing ") == "/trailing\\ "
    assert LeftOut().describe() == ""


def test_a_resume_after_pushed_checkpoints_has_changed_and_one_that_reverted_them_has_not(tmp_path: Path) -> None:
    bare = bare_remote(tmp_path)
    first = Checkout(tmp_path / "hostA" / "w", str(bare), "tasuki/6-resume00")
    first.prepare(fresh=True)
    base = first.tree.base
    assert base is not None
    assert not first.changed_since(base)
    (first.path / "calc.py").write_text(FIXED_CALC)
    assert first.checkpoint(1)
    first.settle()

    second = Checkout(tmp_path / "hostB" / "w", str(bare), "tasuki/6-resume00")
    assert second.prepare(fresh=False, steps=1)
    second.commit("fix add")
    assert second.changed_since(base)  # the work came with the checkpoint: compared with the base, not with it

    third = Checkout(tmp_path / "hostC" / "w", str(bare), "tasuki/6-resume00")
    assert third.prepare(fresh=False, steps=1)
    (third.path / "calc.py").write_text(BUGGY_CALC)  # the agent undid it
    assert not third.commit("nothing")
    assert not third.changed_since(base)
    third.drop_checkpoints()
    assert branches(bare) == {"main"}


def test_a_holder_taken_over_cannot_drop_the_checkpoints_of_the_holder_after_it(tmp_path: Path) -> None:
    bare = bare_remote(tmp_path)
    first = Checkout(tmp_path / "hostA" / "w", str(bare), "tasuki/7-fenced00")
    first.prepare(fresh=True)
    first.settle()
    second = Checkout(tmp_path / "hostB" / "w", str(bare), "tasuki/7-fenced00")
    second.prepare(fresh=False, steps=1)  # the takeover claims the checkpoint branch
    claimed = git(bare, "rev-parse", "tasuki-checkpoints/7-fenced00").strip()

    assert not first.changed_since(first.tree.base)  # the first holder, paused past its takeover, changed nothing
    with pytest.raises(GitError, match="push failed"):
        first.drop_checkpoints()
    assert git(bare, "rev-parse", "tasuki-checkpoints/7-fenced00").strip() == claimed
    second.drop_checkpoints()
    assert branches(bare) == {"main"}


# -- whole tasks: the agent's commands, the forge ------------------------------------------------------------


@pytest.fixture
def forge(tmp_path: Path) -> Iterator[FakeForge]:
    with FakeForge(tmp_path / "forge", TOKEN).serve() as fake:
        bare = fake.add_repo(OWNER, REPO, make_buggy_repo(tmp_path / "source"))
        record(bare)
        yield fake


def bash(command: str) -> dict[str, Any]:
    return {"content": "Run it.", "tool_calls": [tool("bash", command=command)]}


def run_task(
    forge: FakeForge, settings_for: Callable[..., Settings], turns: list[dict[str, Any]], **request_fields: Any
) -> tuple[dict[str, Any], str]:
    """One task on issue 1 of team/calc, run by the worker's code with the fake forge as its reporter."""
    server = serve(ReplayModel(turns_from_entries(turns)))
    try:
        settings = settings_for(
            {**provider_env("openai", server.url, 32768), "TASUKI__GITHUB__API_URL": forge.github_api_url}
        )
        key = {"task_source": "github", "owner": OWNER, "repo": REPO, "task_type": "issue", "task_id": "1"}
        request = TaskRequest(
            key, prompt="Fix add().", user="alice", trigger={"kind": "label", "user": "alice"}, **request_fields
        )
        uuid = str(uuid_module.uuid4())
        reporter = ForgeReporter(GitHubForge(forge.github_api_url, TOKEN), request, uuid, LABELS, "tasuki-bot")
        store = ContextStore(settings.contexts.base_dir, fsync="never")
        try:
            run = TaskRun(
                uuid,
                request,
                settings,
                store,
                reporter=reporter,
                provider_for=lambda config: provider_for(config, settings),
            )
            outcome = run.execute(llm_config(settings))
        finally:
            reporter.close()
    finally:
        server.stop()
    return outcome, uuid


INSTALL = (
    "python3 -c \"import pathlib; [pathlib.Path(f'.venv/lib/m{n}.py').parent.mkdir(parents=True, "
    "exist_ok=True) or pathlib.Path(f'.venv/lib/m{n}.py').write_text('x') for n in range(40)]\" && "
    "mkdir -p node_modules/left-pad && echo 'module.exports = 1;' > node_modules/left-pad/index.js && "
    "echo '{}' > node_modules/left-pad/package.json"
)


def test_a_task_pushes_and_delivers_its_change_without_the_install_and_names_what_it_left_out(
    forge: FakeForge, make_settings: Callable[..., Settings]
) -> None:
    forge.add_item(OWNER, REPO, 1, "add() subtracts", labels=[LABELS.trigger])
    turns = [
        bash(INSTALL),
        bash("head -c 6291456 /dev/zero > data.bin && sed -i 's/a - b/a + b/' calc.py"),
        finish_turn("Fixed add()."),
    ]
    outcome, uuid = run_task(forge, make_settings, turns)

    assert outcome["status"] == "completed", outcome
    note = "left out of the commit: .venv/ (40 files), node_modules/ (2 files), data.bin (6 MB > 5 MB)"
    assert outcome["left_out"] == note
    bare = forge.git_root / OWNER / f"{REPO}.git"
    branch = f"tasuki/1-{uuid[:8]}"
    assert files_on(bare, branch) == {"calc.py", "test_calc.py"}
    assert forge.branch_file(OWNER, REPO, branch, "calc.py") == FIXED_CALC
    refs = {ref for ref, _ in pushed(bare)}
    assert any(ref.startswith("refs/heads/tasuki-checkpoints/") for ref in refs)  # checkpoints went out, checked
    assert {path for _, path in pushed(bare)} == {"calc.py", "test_calc.py"}
    change = forge.change(OWNER, REPO, branch)
    assert note in change.body
    item = forge.item(OWNER, REPO, 1)
    assert item.comments[-1].body.startswith(f"**Tasuki finished.** {change.url}")
    assert note in item.comments[-1].body


def test_a_task_that_changed_nothing_pushes_no_branch_opens_nothing_and_says_so(
    forge: FakeForge, make_settings: Callable[..., Settings]
) -> None:
    forge.add_item(OWNER, REPO, 1, "Is add() right?", labels=[LABELS.trigger])
    turns = [bash(f"cat calc.py && {INSTALL}"), finish_turn("add() subtracts; the issue asks a question only.")]
    outcome, _uuid = run_task(forge, make_settings, turns)

    assert outcome["status"] == "completed", outcome
    assert outcome["unchanged"] is True
    assert "branch" not in outcome
    assert "commit" not in outcome
    bare = forge.git_root / OWNER / f"{REPO}.git"
    assert branches(bare) == {"main"}  # no task branch, no checkpoint branch left behind
    assert not forge.changes
    item = forge.item(OWNER, REPO, 1)
    assert item.labels == [LABELS.done]
    last = item.comments[-1].body
    assert last.startswith("**Tasuki finished:** no changes were needed/made: add() subtracts;")
    assert "left out of the commit: .venv/ (40 files), node_modules/ (2 files)" in last
    assert any("Result: no changes" in c.body for c in item.comments)


def test_a_follow_up_that_changed_nothing_pushes_nothing_and_comments_on_its_pull_request(
    forge: FakeForge, make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    bare = forge.git_root / OWNER / f"{REPO}.git"
    branch = "tasuki/1-0badcafe"
    work = make_buggy_repo(tmp_path / "pr")
    (work / "calc.py").write_text(FIXED_CALC)
    git(work, "commit", "-qam", "fix add")
    git(work, "push", "-q", str(bare), f"HEAD:refs/heads/{branch}")
    head = git(bare, "rev-parse", branch).strip()
    forge.add_item(OWNER, REPO, 100, "Fix add() (#1)", kind="pull_request")
    before = pushed(bare)
    followup = {"kind": "comment", "pull_kind": "pull_request", "pull": 100, "branch": branch}
    turns = [bash("python3 -c 'import calc; print(calc.add(2, 2))'"), finish_turn("add() already adds: 4.")]
    outcome, _ = run_task(forge, make_settings, turns, followup=followup)

    assert outcome["status"] == "completed", outcome
    assert outcome["unchanged"] is True
    assert git(bare, "rev-parse", branch).strip() == head  # no push to the pull request's branch
    assert branches(bare) == {"main", branch}
    assert [ref for ref, _ in pushed(bare)[len(before) :] if not ref.startswith("refs/heads/tasuki-checkpoints/")] == []
    assert not forge.changes
    pull = forge.item(OWNER, REPO, 100)
    assert pull.comments[-1].body.startswith("**Tasuki finished:** no changes were needed/made: add() already adds")


def test_submit_wait_says_a_task_pushed_nothing_and_what_it_left_out() -> None:
    state = {
        "status": "completed",
        "result": {"summary": "s", "unchanged": True, "left_out": "left out of the commit: x"},
    }
    assert outcome_lines(state, None) == ["no changes: nothing was pushed", "left out of the commit: x"]
