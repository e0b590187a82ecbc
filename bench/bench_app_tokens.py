"""GitHub App installation tokens over hours of task (issue 28): how often GitHub is asked for a new one.

Two installations, each with a task that comments every 10 seconds (its progress, the most frequent call) and
pushes every 5 minutes, for three simulated hours (one with ``--quick``) against the fake GitHub: real HTTP,
real git, the App's JWT checked with its public key, tokens that expire after an hour. The worker's cache and
the fake share a clock that jumps ahead instead of waiting, so hours take seconds. Counted per installation:
tokens issued (expected: 1 per ~55 minutes, each hour's token renewed 5 minutes before it ends), the minutes
between renewals, and API calls and pushes per token — against the baseline of a token per call. GitHub
refusing any call (an expired token: 401) is an error, not a figure.

For information: one API call's time with the App's credential against the same call with a static token,
alternately (the cache lookup and the per-request header are all the App adds to a call).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from bench.common import Result, standalone
from tests.helpers.fake_forge import FakeForge
from tests.helpers.fake_github_app import FakeApp
from tests.helpers.stack import make_buggy_repo
from worker.checkout import Checkout
from worker.forges import ItemRef
from worker.forges.github import GitHubForge
from worker.forges.github_app import GitHubApp, InstallationCredential

APP_ID, SLUG = 7, "tasuki-bench"
INSTALLATIONS = {101: "alpha", 102: "beta"}
OWNER = "bench"
STEP_S, PUSH_EVERY_S = 10.0, 300.0
HOUR = 3600.0
TARGET_MINUTES = 55.0


@dataclass
class Clock:
    now: float

    def __call__(self) -> float:
        return self.now


@dataclass
class Task:
    installation: int
    client: GitHubForge
    checkout: Checkout
    ref: ItemRef
    calls: int = 0
    pushes: int = 0


def _tasks(forge: FakeForge, app: GitHubApp, scratch: Path) -> list[Task]:
    tasks = []
    for installation, repo in INSTALLATIONS.items():
        credential = InstallationCredential(app, OWNER, repo, installation)
        client = GitHubForge(forge.github_api_url, credential, identity=credential.identity)
        remote = forge.git_url(OWNER, repo)
        checkout = Checkout(scratch / f"work-{repo}", remote, "tasuki/1-bench", git_env=client.git_env(remote))
        checkout.prepare(fresh=True)
        tasks.append(Task(installation, client, checkout, ItemRef(OWNER, repo, "issue", 1)))
    return tasks


def _simulate(tasks: list[Task], clock: Clock, hours: float) -> None:
    """Every task's calls, STEP_S apart on the shared clock, for ``hours``."""
    comment_ids: dict[int, int | None] = {}
    for step in range(int(hours * HOUR / STEP_S)):
        for task in tasks:
            comment_ids[task.installation] = task.client.comment(task.ref, f"progress at {clock.now:.0f}",
                                                                 comment_ids.get(task.installation))
            task.calls += 1
            if step % int(PUSH_EVERY_S / STEP_S) == 0:
                (task.checkout.path / "notes.txt").write_text(f"{clock.now}\n")
                task.checkout.commit(f"notes at {clock.now:.0f}")
                task.checkout.push()
                task.pushes += 1
        clock.now += STEP_S


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Simulate the hours; count tokens per installation."""
    hours = 1.0 if quick else 3.0
    clock = Clock(1_900_000_000.0)
    fake = FakeApp.generate(APP_ID, SLUG, clock=clock)
    for installation, repo in INSTALLATIONS.items():
        fake.install(installation, (OWNER, repo))
    with FakeForge(scratch / "forge", "static-bench-token", bot_login=fake.bot_login, app=fake).serve() as forge:
        for repo in INSTALLATIONS.values():
            forge.add_repo(OWNER, repo, make_buggy_repo(scratch / f"source-{repo}"))
            forge.add_item(OWNER, repo, 1, "Bench", "Comment often.")
        app = GitHubApp(forge.github_api_url, APP_ID, fake.private_key, clock=clock)
        tasks = _tasks(forge, app, scratch)
        _simulate(tasks, clock, hours)
        for task in tasks:
            task.client.close()
    if fake.refused:
        raise RuntimeError(f"GitHub refused {len(fake.refused)} calls (first: {fake.refused[0]}): a token expired")
    return _report(tasks, fake, hours) + _overhead(scratch, quick)


def _report(tasks: list[Task], fake: FakeApp, hours: float) -> list[Result]:
    results = []
    for task in tasks:
        issued = [t.issued_at for t in fake.issued if t.installation == task.installation]
        gaps = [(b - a) / 60 for a, b in pairwise(issued)]
        minutes = statistics.median(gaps) if gaps else float("inf")
        per_token = (task.calls + task.pushes) / len(issued)
        print(f"installation {task.installation}: {hours:.0f} h of task, {task.calls} API calls and {task.pushes} "
              f"pushes, {len(issued)} tokens: the first at the start, then one every {minutes:.1f} min "
              f"({60 / minutes:.2f} per hour); {per_token:.0f} calls and pushes per token", flush=True)
        results.append(Result(f"app tokens: minutes between renewals, installation {task.installation}",
                              f"{minutes:.1f}", "~55", abs(minutes - TARGET_MINUTES) <= 1.0 if gaps else None))
        results.append(Result(f"app tokens per call vs a token per call, installation {task.installation}",
                              f"{len(issued) / (task.calls + task.pushes):.4f}", "<= 0.01",
                              len(issued) / (task.calls + task.pushes) <= 0.01))
    return results


def _overhead(scratch: Path, quick: bool) -> list[Result]:
    """One API call with the App's credential vs a static token, on two fakes of the same code, alternately."""
    rounds = 20 if quick else 200
    clock = Clock(time.time())
    fake = FakeApp.generate(APP_ID, SLUG, clock=clock)
    fake.install(101, (OWNER, "alpha"))
    with FakeForge(scratch / "app-forge", "unused", app=fake).serve() as app_forge, \
            FakeForge(scratch / "token-forge", "static-bench-token").serve() as token_forge:
        for forge in (app_forge, token_forge):
            forge.add_repo(OWNER, "alpha", make_buggy_repo(scratch / f"overhead-{id(forge)}"))
        app = GitHubApp(app_forge.github_api_url, APP_ID, fake.private_key, clock=clock)
        credential = InstallationCredential(app, OWNER, "alpha", 101)
        clients = (GitHubForge(app_forge.github_api_url, credential), GitHubForge(token_forge.github_api_url,
                                                                                  "static-bench-token"))
        times: tuple[list[float], list[float]] = ([], [])
        for _ in range(rounds):
            for client, measured in zip(clients, times, strict=True):
                start = time.perf_counter()
                client.repository(OWNER, "alpha")
                measured.append(time.perf_counter() - start)
        for client in clients:
            client.close()
    with_app, with_token = (statistics.median(t) for t in times)
    ratio = with_app / with_token
    print(f"one API call: {with_app * 1000:.2f} ms with the App's credential vs {with_token * 1000:.2f} ms with a "
          f"static token: {ratio:.2f}×", flush=True)
    return [Result("app tokens: one API call, App credential vs static token", f"{ratio:.2f}", "-", None)]


if __name__ == "__main__":
    standalone(run, __doc__)
