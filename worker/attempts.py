"""Several attempts per task (issue 39 item 5, docs/attempts.md): the pure rules — how many attempts a task gets, the
names its attempts run under, which attempt is delivered, and which kept branches are due for deletion.

Nothing here touches Redis, git or a forge: the Celery side (:mod:`worker.attempt_tasks`) reads the facts and acts.
"""

from __future__ import annotations

import uuid as uuid_module
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

ATTEMPT_SUFFIX = ".a"  # the attempt's task key: the parent's task_id + ".a<i>", so each attempt has a key of its own
NAMESPACE = uuid_module.UUID("6f1d3c2a-59b4-4a4e-9f3e-7d1e3a0b8c21")
REASON_MAX_CHARS = 500
MAX_ATTEMPTS = 8  # agents per task at most: each is a whole task (a worker slot, a model's spend)

Review = Callable[[Sequence["Candidate"]], Any]
"""A reviewer: shown the candidates (their diffs), answers the attempt number it prefers (an int, or text holding
one); anything else — an exception, a number that is no candidate's — is nonsense and the review is skipped."""


@dataclass(frozen=True)
class Candidate:
    """One finished attempt as the pick sees it: ``checks_passed`` None when no checks ran (no gate, none declared),
    ``changed_lines`` 0 (and an empty ``diff``) when it delivered nothing (it changed nothing, or failed)."""

    attempt: int
    uuid: str
    branch: str | None
    checks_passed: bool | None
    changed_lines: int
    diff: str
    delivered: bool = True  # it completed and pushed a branch with a change

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "uuid": self.uuid, "branch": self.branch, "checks_passed": self.checks_passed,
                "changed_lines": self.changed_lines, "delivered": self.delivered}


@dataclass(frozen=True)
class Pick:
    """The attempt delivered (None: none delivered anything) and why, in one sentence for the pull request."""

    winner: Candidate | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"winner": self.winner.attempt if self.winner is not None else None, "reason": self.reason}


def pick(candidates: Sequence[Candidate], review: Review | None = None) -> Pick:
    """The attempt to deliver: only attempts that delivered a change count; of those, the ones whose checks passed,
    else the ones no check judged, else those whose checks fail; among several, the reviewer's choice when it gives
    a sensible one, else the smallest change (the earliest attempt on a tie)."""
    delivered = [c for c in candidates if c.delivered and c.branch and c.changed_lines > 0]
    if not delivered:
        return Pick(None, f"none of the {len(candidates)} attempts delivered a change")
    tiers = ((True, "its checks passed"), (None, "no checks judged it, and no attempt's checks passed"),
             (False, "every attempt's checks fail"))
    verdict, why, pool = next((v, w, [c for c in delivered if c.checks_passed is v]) for v, w in tiers
                              if any(c.checks_passed is v for c in delivered))
    if len(pool) == 1:
        only = pool[0]
        others = len(candidates) - 1
        return Pick(only, f"attempt {only.attempt} of {len(candidates)}: {why}" +
                    (f" (the only one; {others} other attempt(s) did not)" if verdict is True and others else ""))
    pool = sorted(pool, key=lambda c: c.attempt)
    tied = f"{len(pool)} attempts tie ({why})"
    if review is not None:
        chosen = reviewed(pool, review)
        if chosen is not None:
            return Pick(chosen, f"attempt {chosen.attempt} of {len(candidates)}: {tied}; the reviewer preferred it")
    smallest = min(pool, key=lambda c: (c.changed_lines, c.attempt))
    return Pick(smallest, f"attempt {smallest.attempt} of {len(candidates)}: {tied}; the smallest change "
                          f"({smallest.changed_lines} lines)")


def reviewed(pool: Sequence[Candidate], review: Review) -> Candidate | None:
    """The candidate the reviewer names; None when it fails or answers nonsense (then the next rule decides)."""
    try:
        answer = review(pool)
    except Exception:
        return None
    number = answer_number(answer)
    return next((c for c in pool if c.attempt == number), None)


def answer_number(answer: Any) -> int | None:
    """The attempt number in a reviewer's answer: an int, or the only number in a short text ("attempt 2")."""
    if isinstance(answer, bool):
        return None
    if isinstance(answer, int):
        return answer
    if not isinstance(answer, str) or len(answer) > 2000:
        return None
    numbers = {int(word) for word in "".join(ch if ch.isdigit() else " " for ch in answer).split()}
    return numbers.pop() if len(numbers) == 1 else None


def review_prompt(pool: Sequence[Candidate], task: str, max_chars: int = 40_000) -> str:
    """What a reviewer profile is asked: the task and each attempt's diff (each cut to its share of ``max_chars``)."""
    share = max(max_chars // max(len(pool), 1), 1000)
    parts = [f"Several attempts solved this task independently:\n<task>\n{task.strip()[:4000]}\n</task>"]
    for c in pool:
        diff = c.diff if len(c.diff) <= share else c.diff[:share] + "\n[... diff cut ...]"
        parts.append(f"<attempt number=\"{c.attempt}\">\n{diff}\n</attempt>")
    parts.append("Which attempt solves the task best (correct, complete, no unrelated changes)? "
                 "Answer with its number only.")
    return "\n\n".join(parts)


# -- how many, and under which names ----------------------------------------------------------------------------


def attempts_for(default: int, repositories: Mapping[str, int], labels: Mapping[str, int], maximum: int,
                 task_key: Mapping[str, Any], issue_labels: Iterable[str] = (), requested: int | None = None) -> int:
    """How many attempts a task gets: its own (``--attempts``, the API's field), else the most any of its issue's
    labels asks for, else its repository's (``source/owner/name`` before ``owner/name``), else the default; within
    1..``maximum``."""
    if requested is None:
        by_label = [labels[name] for name in issue_labels if name in labels]
        if by_label:
            requested = max(by_label)
        else:
            owner, repo = task_key.get("owner"), task_key.get("repo")
            for key in (f"{task_key.get('task_source')}/{owner}/{repo}", f"{owner}/{repo}"):
                if key in repositories:
                    requested = repositories[key]
                    break
    return max(1, min(int(requested if requested is not None else default), maximum))


def attempt_uuid(parent: str, number: int) -> str:
    """Attempt ``number``'s UUID, derived from its parent's: a fan-out run twice admits the same attempts."""
    return str(uuid_module.uuid5(NAMESPACE, f"{parent}/a{number}"))


def attempt_task_key(task_key: Mapping[str, str], number: int) -> dict[str, str]:
    """Attempt ``number``'s task key: the parent's with ``.a<number>`` after its id (one active task per key holds
    for the parent and for each attempt)."""
    return {**task_key, "task_id": f"{task_key['task_id']}{ATTEMPT_SUFFIX}{number}"}


def attempt_branch(parent_branch: str, number: int) -> str:
    """Attempt ``number``'s branch: ``<the parent's branch>-a<number>``."""
    return f"{parent_branch}-a{number}"


def attempt_request(request: Mapping[str, Any], parent: str, parent_branch: str, number: int, of: int,
                    issue: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The request of attempt ``number`` of ``of``: the parent's, under its own key, branch and a note of which
    attempt it is; one attempt (never several) — an attempt asks for no attempts of its own."""
    child = {key: value for key, value in request.items() if key != "attempts"}
    child["task_key"] = attempt_task_key(request["task_key"], number)
    child["attempt"] = {"parent": parent, "number": number, "of": of,
                        "branch": attempt_branch(parent_branch, number), "parent_task_key": dict(request["task_key"])}
    if issue is not None:
        child["issue"] = dict(issue)
    return child


def attempt_note(attempt: Mapping[str, Any] | None) -> str:
    """The line an attempt's first prompt gets: it is one of several, and the best one is delivered."""
    if not attempt:
        return ""
    return (f"This is attempt {attempt['number']} of {attempt['of']}: {attempt['of']} agents work on this task "
            "independently, and the one whose checks pass (then the smallest change) is delivered.")


# -- the kept branches ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeptBranch:
    """A branch of an attempt that was not delivered, kept since ``since`` (when the pick was delivered)."""

    parent: str
    branch: str
    since: datetime


def due_for_deletion(kept: Iterable[KeptBranch], now: datetime, keep_days: float) -> list[KeptBranch]:
    """The kept branches whose time is up at ``now``: kept ``keep_days`` days or more."""
    limit = timedelta(days=keep_days)
    return [k for k in kept if now - k.since >= limit]


def pick_body(chosen: Pick, candidates: Sequence[Candidate], summary: str) -> str:
    """The pull request's text: the winner's summary, then which attempt won, why, and where the others are."""
    lines = [summary.strip(), "", "### Attempts", chosen.reason[:REASON_MAX_CHARS] + "."]
    for c in sorted(candidates, key=lambda c: c.attempt):
        checks = {True: "checks pass", False: "checks fail", None: "no checks ran"}[c.checks_passed]
        outcome = f"{c.changed_lines} lines changed, {checks}" if c.delivered and c.changed_lines else "no change"
        mark = " (delivered)" if chosen.winner is not None and c.attempt == chosen.winner.attempt else ""
        where = f" on `{c.branch}`" if c.branch and c.delivered and c.changed_lines else ""
        lines.append(f"- attempt {c.attempt}{mark}: {outcome}{where}, task `{c.uuid}`")
    return "\n".join(lines).strip()
