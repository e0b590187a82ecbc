"""One owner token for every effect (issue 26 §1): a holder that was taken over pushes nothing (the remote refuses
its leases), its late writes land outside the checkout the next holder uses, a fenced context refuses model calls
and tool runs, and a pull/merge request is opened once per branch however the openers interleave.

Real git with local remotes, real processes, the fake forge over real HTTP. The real-worker SIGSTOP tests are in
tests/test_fencing_sigstop.py."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contexts import ContextStore, FencedError
from tests.helpers.fake_forge import FakeForge
from tests.helpers.stack import git, make_buggy_repo
from worker.checkout import Checkout, GitError
from worker.forges import GiteaForge, GitHubForge, GitLabForge

BRANCH = "tasuki/7-fenced00"
CHECKPOINTS = "refs/heads/tasuki-checkpoints/7-fenced00"


def remote_refs(remote: Path) -> dict[str, str]:
    listed = git(remote, "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads")
    return dict(line.split(" ", 1) for line in listed.splitlines())


def holder(root: Path, name: str, remote: Path) -> Checkout:
    return Checkout(root / name / "workspace", str(remote), BRANCH)


def test_a_holder_taken_over_can_push_neither_a_checkpoint_nor_its_branch(tmp_path: Path) -> None:
    remote = make_buggy_repo(tmp_path / "remote")
    first = holder(tmp_path, "hostA", remote)
    first.prepare(fresh=True)
    (first.path / "calc.py").write_text("def add(a, b):\n    return a + b  # first\n")
    assert first.checkpoint(1)
    first.settle()
    first_checkpoint = remote_refs(remote)[CHECKPOINTS]

    second = holder(tmp_path, "hostB", remote)  # the takeover, on another host: it claims the checkpoints
    second.prepare(fresh=False, steps=1)
    claimed = remote_refs(remote)[CHECKPOINTS]
    assert claimed != first_checkpoint
    assert (second.path / "calc.py").read_text() == (first.path / "calc.py").read_text()

    # The first holder wakes up (paused past its takeover) and goes on as if nothing happened.
    (first.path / "calc.py").write_text("def add(a, b):\n    return a + b  # stale\n")
    assert first.checkpoint(2)
    with pytest.raises(GitError, match="push failed"):
        first.pushes.wait()  # tried twice: refused twice
    first.commit("tasuki: stale work")
    with pytest.raises(GitError, match="push failed"):
        first.push()
    assert remote_refs(remote) == {"refs/heads/main": remote_refs(remote)["refs/heads/main"], CHECKPOINTS: claimed}

    second.commit("tasuki: the work")
    second.push()
    assert remote_refs(remote).get(f"refs/heads/{BRANCH}") == second.head()
    assert CHECKPOINTS not in remote_refs(remote)
    with pytest.raises(GitError, match="push failed"):
        first.push()  # also once the task is done
    assert remote_refs(remote)[f"refs/heads/{BRANCH}"] == second.head()
    assert "stale" not in git(remote, "show", f"{BRANCH}:calc.py")


def test_a_takeover_on_the_same_host_claims_the_tree_it_was_left(tmp_path: Path) -> None:
    """A resume on the holder's own tree (a hand-back) claims too: its last unpushed checkpoint is what it claims."""
    remote = make_buggy_repo(tmp_path / "remote")
    first = holder(tmp_path, "host", remote)
    first.prepare(fresh=True)
    first.settle()
    (first.path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    first.checkpoint(1)
    first.settle()
    before = remote_refs(remote)[CHECKPOINTS]

    again = holder(tmp_path, "host", remote)
    assert again.prepare(fresh=False, steps=1)
    after = remote_refs(remote)[CHECKPOINTS]
    assert after != before
    assert git(remote, "rev-parse", f"{after}^{{tree}}") == git(remote, "rev-parse", f"{before}^{{tree}}")
    assert git(remote, "log", "-1", "--format=%s", after).strip() == "tasuki: checkpoint after step 1"
    with pytest.raises(GitError):
        first.push()  # the first handle's lease is gone with the claim
    again.commit("tasuki: the work")
    again.push()
    assert remote_refs(remote)[f"refs/heads/{BRANCH}"] == again.head()


def test_late_writes_of_a_holder_set_aside_land_outside_the_checkout(tmp_path: Path) -> None:
    remote = make_buggy_repo(tmp_path / "remote")
    first = holder(tmp_path, "shared", remote)
    first.prepare(fresh=True)
    first.settle()
    started, release = tmp_path / "started", tmp_path / "release"
    # A tool call of the first holder, in the checkout, that goes on writing after its holder lost the task.
    script = (f"touch {started}; while [ ! -e {release} ]; do sleep 0.01; done; "
              "echo late >> calc.py; echo late > late.txt")
    late = subprocess.Popen(["sh", "-c", script], cwd=first.path)
    try:
        deadline_wait(started.exists)
        second = holder(tmp_path, "shared", remote)  # the same workspaces directory (the compose layout)
        second.set_aside()
        second.prepare(fresh=False)
        release.touch()
        late.wait(timeout=30)
    finally:
        late.kill()
    assert not (second.path / "late.txt").exists()
    assert "late" not in (second.path / "calc.py").read_text()
    # The aside copies are deleted; the new holder has its checkout, its own home (SPEC §17) and the worker's own git
    # directory of the checkout (issue 36: never the agent's .git).
    assert sorted(p.name for p in second.path.parent.iterdir()) == ["workspace", "workspace.git", "workspace.home"]


def deadline_wait(predicate: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)


def test_a_fenced_context_refuses_the_owner_check(tmp_path: Path) -> None:
    store = ContextStore(tmp_path / "contexts", heartbeat_interval_s=3600, stale_after_s=0.0, hostname="hostA")
    ctx = store.create({"task_source": "local", "owner": "o", "repo": "r", "task_type": "prompt", "task_id": "1"},
                       {"provider": "p", "model": "m", "context_length": 1000}, heartbeat=False)
    ctx.assert_owner()
    other = ContextStore(tmp_path / "contexts", heartbeat_interval_s=3600, stale_after_s=0.0, hostname="hostB")
    taken = other.open(ctx.uuid)  # stale at once (stale_after_s 0) from another host: taken over
    with pytest.raises(FencedError):
        ctx.assert_owner()
    with pytest.raises(FencedError), ctx.holding():  # the fence every push and forge write runs in
        pytest.fail("a fenced holder's effect ran")
    taken.assert_owner()
    with taken.holding() as recorded:
        assert recorded is None  # one host records no checkpoint beside the directory
    taken.detach()


# -- the forge: one pull/merge request per branch --------------------------------------------------------------

TOKEN = "ghp_0123456789abcdefABCDEF0123456789abcd"
OWNER, REPO = "octo-org", "calc"


@pytest.fixture(params=["github", "gitlab", "gitea"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[FakeForge, str]]:
    with FakeForge(tmp_path / "server", TOKEN).serve() as fake:
        fake.add_repo(OWNER, REPO, make_buggy_repo(tmp_path / "source"))
        yield fake, str(request.param)


def make_client(fake: FakeForge, kind: str) -> GitHubForge | GitLabForge | GiteaForge:
    if kind == "github":
        return GitHubForge(fake.github_api_url, TOKEN, backoff_s=0.01)
    if kind == "gitea":
        return GiteaForge(fake.gitea_api_url, TOKEN, backoff_s=0.01)
    return GitLabForge(fake.gitlab_api_url, TOKEN, backoff_s=0.01)


def test_two_openers_that_both_found_no_request_open_one(opener: tuple[FakeForge, str], tmp_path: Path) -> None:
    """The race of a fenced holder's late open with the new holder's: both looked, found none, both post."""
    fake, kind = opener
    late, current = make_client(fake, kind), make_client(fake, kind)
    url = fake.git_url(OWNER, REPO)
    pusher = Checkout(tmp_path / "push", url, "tasuki/1-race0000", git_env=current.git_env(url))
    pusher.prepare(fresh=True)
    pusher.settle()
    pusher.push()
    real_request = late.http.request

    def look_then_lose_the_race(method: str, path: str, **kwargs: Any) -> Any:
        answer = real_request(method, path, **kwargs)
        if method == "GET" and ("pulls" in path or "merge_requests" in path) and not fake.changes:  # none found
            current.open_change(OWNER, REPO, "tasuki/1-race0000", "main", "Fix", "body")
        return answer

    late.http.request = look_then_lose_the_race  # type: ignore[method-assign]
    try:
        url = late.open_change(OWNER, REPO, "tasuki/1-race0000", "main", "Fix", "body")
    finally:
        late.close()
        current.close()
    assert len(fake.changes) == 1
    assert url == fake.changes[0].url
