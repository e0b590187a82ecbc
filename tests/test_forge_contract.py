"""One contract, three forges: GitHub REST, GitLab REST v4 and Gitea REST v1 against the fake forge over real HTTP
and git."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.fake_forge import FakeForge
from tests.helpers.stack import make_buggy_repo
from worker.checkout import Checkout, GitError
from worker.forges import Forge, ForgeError, GiteaForge, GitHubForge, GitLabForge, ItemRef

TOKEN = "ghp_0123456789abcdefABCDEF0123456789abcd"
OWNER, REPO = "octo-org", "calc"


@pytest.fixture(scope="module")
def forge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeForge]:
    root = tmp_path_factory.mktemp("forge")
    with FakeForge(root / "server", TOKEN).serve() as fake:
        fake.add_repo(OWNER, REPO, make_buggy_repo(root / "source"))
        yield fake


def make_client(source: str, forge: FakeForge) -> Forge:
    if source == "github":
        return GitHubForge(forge.github_api_url, TOKEN, backoff_s=0.01)
    if source == "gitlab":
        return GitLabForge(forge.gitlab_api_url, TOKEN, backoff_s=0.01)
    return GiteaForge(forge.gitea_api_url, TOKEN, backoff_s=0.01)


@pytest.fixture(params=["github", "gitlab", "gitea"])
def client(request: pytest.FixtureRequest, forge: FakeForge) -> Iterator[Forge]:
    made = make_client(request.param, forge)
    yield made
    made.close()
    forge.faults.clear()


_numbers = iter(range(1, 10_000))


def new_issue(forge: FakeForge, labels: list[str] | None = None) -> ItemRef:
    number = next(_numbers)
    forge.add_item(OWNER, REPO, number, "add() subtracts", "calc.add(2, 3) returns -1", labels=labels,
                   comments=(("alice", "Confirmed."), ("bob", "> Confirmed.\nMe too.")))
    return ItemRef(OWNER, REPO, "issue", number)


def test_repository_gives_clone_url_without_credentials_and_default_branch(
    client: Forge, forge: FakeForge
) -> None:
    repository = client.repository(OWNER, REPO)
    assert repository.clone_url == forge.git_url(OWNER, REPO)
    assert repository.default_branch == "main"
    assert TOKEN not in repository.clone_url


def test_read_item_gives_title_body_labels_and_comments_in_order(
    client: Forge, forge: FakeForge
) -> None:
    ref = new_issue(forge, labels=["coding agent"])
    item = client.read_item(ref)
    assert (item.title, item.body, item.labels) == ("add() subtracts", "calc.add(2, 3) returns -1", ("coding agent",))
    assert [(c.author, c.body) for c in item.comments] == [("alice", "Confirmed."), ("bob", "> Confirmed.\nMe too.")]


def test_labels_move_and_removing_an_absent_label_is_not_an_error(
    client: Forge, forge: FakeForge
) -> None:
    ref = new_issue(forge, labels=["coding agent", "bug"])
    client.move_labels(ref, add=["coding agent processing"], remove=["coding agent", "coding agent failed"])
    assert forge.item(OWNER, REPO, ref.number).labels == ["bug", "coding agent processing"]


def test_comment_is_created_then_updated_in_place(client: Forge, forge: FakeForge) -> None:
    ref = new_issue(forge)
    comment_id = client.comment(ref, "working: step 1")
    assert client.comment(ref, "working: step 2", comment_id) == comment_id

    comments = forge.item(OWNER, REPO, ref.number).comments
    mine = [c for c in comments if c.id == comment_id]
    assert len(comments) == 3
    assert (mine[0].body, mine[0].history) == ("working: step 2", ["working: step 1"])


def test_updating_a_deleted_comment_posts_a_new_one(client: Forge, forge: FakeForge) -> None:
    ref = new_issue(forge)
    new_id = client.comment(ref, "progress", comment_id=999_999)
    assert new_id != 999_999
    assert forge.item(OWNER, REPO, ref.number).comments[-1].body == "progress"


def test_push_with_out_of_band_credentials_then_open_change_once(
    client: Forge, forge: FakeForge, tmp_path: Path
) -> None:
    repository = client.repository(OWNER, REPO)
    branch = f"tasuki/{client.source}-1"
    checkout = Checkout(tmp_path / "work", repository.clone_url, branch, git_env=client.git_env(repository.clone_url))
    checkout.prepare()
    (checkout.path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    checkout.commit("fix add")
    checkout.push()

    url = client.open_change(OWNER, REPO, branch, "main", "Fix add()", "Closes #1")
    assert client.open_change(OWNER, REPO, branch, "main", "Fix add()", "Closes #1") == url  # found, not reopened
    opened = [c for c in forge.changes if c.head == branch]
    assert len(opened) == 1
    assert (opened[0].base, opened[0].title) == ("main", "Fix add()")
    assert "return a + b" in forge.branch_file(OWNER, REPO, branch, "calc.py")
    assert TOKEN not in (checkout.path / ".git" / "config").read_text()  # never persisted with the clone


def test_clone_without_credentials_is_refused(client: Forge, forge: FakeForge,
                                              tmp_path: Path) -> None:
    checkout = Checkout(tmp_path / "anon", forge.git_url(OWNER, REPO), "x")
    with pytest.raises(GitError):
        checkout.prepare()


def test_credentials_are_scoped_to_the_clone_url_origin(client: Forge) -> None:
    env = client.git_env("https://git.example.com:8443/org/repo.git")
    assert env["GIT_CONFIG_KEY_0"] == "http.https://git.example.com:8443/.extraHeader"
    assert env["GIT_CONFIG_VALUE_0"].startswith("Authorization: Basic ")
    assert client.git_env("/srv/git/repo.git") == {}  # a local path needs no token and never gets one


def test_missing_issue_is_a_forge_error_that_never_shows_the_token(
    client: Forge, forge: FakeForge
) -> None:
    with pytest.raises(ForgeError, match="404") as caught:
        client.read_item(ItemRef(OWNER, REPO, "issue", 424242))
    assert TOKEN not in str(caught.value)


def test_5xx_and_rate_limits_are_retried(client: Forge, forge: FakeForge) -> None:
    forge.faults.extend([502, 429])
    assert client.repository(OWNER, REPO).default_branch == "main"
    forge.faults.extend([500] * 10)
    with pytest.raises(ForgeError, match="HTTP 500"):
        client.repository(OWNER, REPO)


def test_the_token_only_travels_in_headers(client: Forge, forge: FakeForge) -> None:
    client.read_item(new_issue(forge))
    assert forge.requests
    assert all(TOKEN not in f"{r['path']}?{r['query']}" for r in forge.requests)


def test_gitlab_note_triggers_need_developer_access(forge: FakeForge) -> None:
    gitlab = GitLabForge(forge.gitlab_api_url, TOKEN)
    forge.members.update({7: 30, 8: 20})
    ref = ItemRef(OWNER, REPO, "issue", 1)
    try:
        assert gitlab.allows(ref, {"kind": "comment", "user": "dev", "user_id": 7})
        assert not gitlab.allows(ref, {"kind": "comment", "user": "reporter", "user_id": 8})
        assert not gitlab.allows(ref, {"kind": "comment", "user": "stranger", "user_id": 9})
        assert not gitlab.allows(ref, {"kind": "comment", "user": "unknown"})
        assert gitlab.allows(ref, {"kind": "label", "user": "planner", "user_id": 8})
        assert GitHubForge(forge.github_api_url, TOKEN).allows(ref, {"kind": "comment"})  # checked at intake
    finally:
        gitlab.close()


def test_gitea_comment_triggers_need_an_allowed_repository_permission(forge: FakeForge) -> None:
    gitea = GiteaForge(forge.gitea_api_url, TOKEN)
    forge.permissions.update({"maintainer": "write", "owner": "owner", "watcher": "read"})
    ref = ItemRef(OWNER, REPO, "issue", 1)
    try:
        assert gitea.allows(ref, {"kind": "comment", "user": "maintainer", "user_id": 3})
        assert gitea.allows(ref, {"kind": "review", "user": "owner", "user_id": 1})
        assert not gitea.allows(ref, {"kind": "comment", "user": "watcher", "user_id": 4})
        assert not gitea.allows(ref, {"kind": "comment", "user": "stranger", "user_id": 5})  # 404: no such user
        assert not gitea.allows(ref, {"kind": "comment", "user_id": 6})  # nobody named
        assert gitea.allows(ref, {"kind": "label", "user": "watcher"})  # changing labels needs write already
    finally:
        gitea.close()


def test_gitea_labels_are_set_by_id_and_the_state_machines_are_created_when_missing(forge: FakeForge) -> None:
    gitea = GiteaForge(forge.gitea_api_url, TOKEN)
    ref = new_issue(forge, labels=["coding agent"])
    before = len(forge.requests)
    try:
        gitea.move_labels(ref, add=["tasuki created this"], remove=["coding agent"])
        gitea.move_labels(ref, add=["tasuki created this"], remove=[])  # found now, not created twice
    finally:
        gitea.close()
    assert forge.item(OWNER, REPO, ref.number).labels == ["tasuki created this"]
    created = [r for r in forge.requests[before:] if r["method"] == "POST" and r["path"].endswith(f"/{REPO}/labels")]
    assert len(created) == 1
