"""A task's life on its issue (SPEC §8): labels trigger → processing → done/failed, one progress comment
updated in place, the pull/merge request, and a final summary comment.

The progress comment is found again by a marker holding the task's UUID, so a worker that resumes the
task on another machine edits the same comment.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import structlog

from contexts.atomic import read_json
from contexts.errors import TasukiError
from contexts.masking import mask
from contexts.names import METADATA_FILE
from contexts.state import read_state
from contexts.usage import format_cost, format_tokens
from worker.endings import Ending, on_ending
from worker.forges import forge_section, is_forge, make_forge
from worker.forges.base import (
    CredentialError,
    Forge,
    ForgeError,
    Item,
    ItemRef,
    ReviewComment,
    find_comment,
    unreadable,
)
from worker.run import TaskRequest, Workplace
from worker.settings_models import LabelSettings, Settings
from worker.threads import marker

log = structlog.get_logger(__name__)

MARKER = "<!-- tasuki:{uuid} -->"
PROGRESS_INTERVAL_S = 10.0  # at most one progress edit per interval between start and finish (API rate limits)
_TITLE_MAX = 120


class TriggerRefused(TasukiError):
    """The user who triggered the task may not start tasks on this repository."""


def progress_body(
    uuid: str, state: dict[str, Any], labels: LabelSettings, change_url: str | None = None, *, priced: bool = False
) -> str:
    """The progress comment: status, steps, tokens and cost, attempt and UUID (and the PR/MR once there is one).
    ``priced``: a price table is configured (else the cost says so)."""
    status = str(state.get("status", "queued"))
    calls, tools = int(state.get("llm_call_count", 0)), int(state.get("tool_call_count", 0))
    lines = [
        MARKER.format(uuid=uuid),
        f"**Tasuki** · `{status}`",
        "",
        "| | |",
        "|---|---|",
        f"| Steps | {calls} model calls, {tools} tool runs |",
        f"| Tokens | {format_tokens(state)} |",
        f"| Cost | {format_cost((state.get('usage') or {}).get('cost_usd'), priced)} |",
        f"| Attempt | {int(state.get('attempt', 1))} |",
        f"| Task | `{uuid}` |",
    ]
    memory = state.get("memory")
    if isinstance(memory, dict):
        lines.append(f"| Memory | {memory_line(memory)} |")
    environment = state.get("environment")
    if isinstance(environment, dict) and environment.get("line"):  # SPEC §17: "restored in 1.8 s", "setup failed: ..."
        lines.append(f"| Environment | {mask(str(environment['line'])).replace('|', '/')[:300]} |")
    if state.get("error"):
        lines.append(f"| Error | {mask(str(state['error'])).replace('|', '/')[:300]} |")
    if change_url:
        lines += ["", f"Result: {change_url}"]
    elif (state.get("result") or {}).get("unchanged"):
        lines += ["", "Result: no changes, nothing pushed"]
    elif status not in ("completed", "failed", "timeout", "cancelled"):
        lines += ["", f"To stop it, comment `/tasuki cancel` or remove the label `{labels.processing}`."]
    return "\n".join(lines)


def memory_line(memory: dict[str, Any]) -> str:
    """What the first prompt got from memory (SPEC §13): instruction files and how many memories."""
    files = ", ".join(f"`{name}`" for name in memory.get("instruction_files") or []) or "none"
    count = int(bool(memory.get("repository_memory"))) + int(bool(memory.get("thread_memory")))
    count += len(memory.get("episodes") or [])
    note = f" ({mask(str(memory['note'])).replace('|', '/')[:120]})" if memory.get("note") else ""
    return f"instruction files: {files}; {count} memories used{note}"


def summary_body(uuid: str, status: str, result: dict[str, Any] | None, error: str | None) -> str:
    """The final comment: the summary and the PR/MR link, or why the task stopped."""
    result = result or {}
    if status == "completed" and result.get("unchanged"):  # nothing pushed, no pull/merge request: say why
        text = f"**Tasuki finished:** no changes were needed/made: {result.get('summary', '')}".rstrip()
    elif status == "completed":
        text = f"**Tasuki finished.** {result.get('pull_request_url', '')}\n\n{result.get('summary', '')}".rstrip()
        if result.get("checks") == "failed":  # the finish gate's checks fail on what it delivered
            text += "\n\nThe repository's checks fail on this change, so the pull request is a draft."
    elif result.get("stopped"):  # a limit stopped it; what it changed is in a draft (or on its branch)
        text = f"**Tasuki stopped: {status}.** {str(result['stopped'])[:1].upper()}{str(result['stopped'])[1:]}."
        if result.get("pull_request_url"):
            text += f"\n\nWhat it changed so far is in a draft: {result['pull_request_url']}"
        elif result.get("branch"):
            text += f"\n\nWhat it changed so far is on the branch `{result['branch']}`."
    else:
        text = f"**Tasuki stopped: {status}.**" + (f"\n\n{error}" if error else "")
    if status == "completed" and result.get("left_out"):
        text += f"\n\n{result['left_out']}"
    return mask(f"{text}\n\n<sub>task `{uuid}`</sub>")


class ForgeReporter:
    """The :class:`~worker.run.Reporter` of a GitHub or GitLab task."""

    def __init__(
        self,
        forge: Forge,
        request: TaskRequest,
        uuid: str,
        labels: LabelSettings,
        bot_login: str,
        *,
        progress_interval_s: float = PROGRESS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        ci_log_lines: int = 200,
        priced: bool = False,
    ) -> None:
        self.priced = priced  # a price table is configured: the progress comment shows a cost
        self.forge = forge
        self.request = request
        self.uuid = uuid
        self.labels = labels
        self.bot_login = bot_login
        followup = request.followup
        # A follow-up works on the pull/merge request: its progress, labels and replies go there.
        self.ref = (ItemRef(request.task_key["owner"], request.task_key["repo"], str(followup["pull_kind"]),
                            int(followup["pull"])) if followup.get("pull") else ItemRef.from_task_key(request.task_key))
        self.ci_log_lines = ci_log_lines
        self.review: list[ReviewComment] = []
        self.progress_interval_s = progress_interval_s
        self.clock = clock
        self.item: Item | None = None
        self.base_branch: str | None = None
        self.comment_id: int | None = None
        self.change_url: str | None = None
        self._last_progress = float("-inf")

    def begin(self, state: dict[str, Any]) -> Workplace:
        """Check the trigger, read the issue, mark it processing, show progress; where to clone."""
        owner, repo = self.request.task_key["owner"], self.request.task_key["repo"]
        if self.ref is not None and not self.forge.allows(self.ref, self.request.trigger):
            raise TriggerRefused(f"{self.request.user or 'the user'} may not start tasks on {owner}/{repo}")
        repository = self.forge.repository(owner, repo)
        self.base_branch = repository.default_branch
        issue = self.request.issue
        if self.ref is not None:
            self.item = self.forge.read_item(self.ref)
            stale = [name for name in self.item.labels if name in (self.labels.trigger, self.labels.done,
                                                                     self.labels.failed)
                     or name.startswith(f"{self.labels.trigger}:")]  # coding agent:NAME, which chose the model
            self.forge.move_labels(self.ref, add=[self.labels.processing], remove=stale)
            self.comment_id = find_comment(self.item.comments, MARKER.format(uuid=self.uuid))
            self._progress(state, force=True)
            issue = self._issue_text(self.item)
            if self.request.followup:
                issue.update(self._followup_text(self.ref))
        return Workplace(repository.clone_url, self.forge.git_env(repository.clone_url), issue)

    def _issue_text(self, item: Item) -> dict[str, Any]:
        """The issue as the prompt quotes it: people's comments only, not the bot's own."""
        comments = [
            {"author": c.author, "body": c.body}
            for c in item.comments
            if c.author.lower() != self.bot_login.lower() and "<!-- tasuki:" not in c.body
        ]
        return {"number": item.ref.number, "title": item.title, "body": item.body, "url": item.url,
                "comments": comments}

    def _followup_text(self, ref: ItemRef) -> dict[str, Any]:
        """What a follow-up addresses: the review comments (from the webhook, and a review's from the API)
        or the failed CI jobs' log tails (from the API)."""
        followup = self.request.followup
        comments = [ReviewComment.from_json(c) for c in followup.get("comments") or []]
        if followup.get("review_id"):
            known = {c.id for c in comments}
            fetched = self.forge.review_comments(ref, int(followup["review_id"]))
            comments += [c for c in fetched if c.id not in known]
        self.review = [c for c in comments if c.id]
        text: dict[str, Any] = {"review_comments": [asdict(c) for c in comments]}
        if followup.get("ci"):
            text.update(self._ci_failures(ref, followup["ci"]))
        return text

    def _ci_failures(self, ref: ItemRef, ci: dict[str, Any]) -> dict[str, Any]:
        """The failed jobs and their log tails; when the forge will not list them (a token without permission
        to read checks), the fix starts anyway and the model is told why it has no log."""
        try:
            jobs = self.forge.failed_jobs(ref.owner, ref.repo, ci, self.ci_log_lines)
        except CredentialError:
            raise  # no credential at all: the task cannot go on, with or without a log
        except ForgeError as exc:
            log.warning("the failed CI jobs could not be read; the fix starts without their logs",
                        error=mask(str(exc))[:300])
            return {"ci_unreadable": unreadable("the failed CI jobs and their logs", exc)}
        return {"ci_failures": [{"name": j.name, "log": j.log} for j in jobs]}

    def heard(self, entry: dict[str, Any]) -> dict[str, Any] | None:
        """A comment for the running task: its author's access is checked here when the intake could not
        (GitLab, Gitea; GitHub's association was checked at the intake); review comments it carries are fetched,
        deduplicated and answered at the end."""
        if self.ref is None:
            return entry
        user_id = entry.get("user_id")  # set when the intake could not check the author (GitLab, Gitea)
        trigger = {"kind": "comment", "user_id": user_id, "user": entry.get("author")}
        if user_id is not None and not self.forge.allows(self.ref, trigger):
            return None
        comments = [ReviewComment.from_json(c) for c in entry.get("comments") or []]
        if entry.get("review_id") and self.ref.kind in ("pull_request", "merge_request"):
            comments += self.forge.review_comments(self.ref, int(entry["review_id"]))
        new: list[ReviewComment] = []
        for comment in comments:
            if comment.id and comment.id not in {c.id for c in self.review + new}:
                new.append(comment)
        self.review += new
        if not new and not str(entry.get("body") or "").strip():
            return None  # only review comments this task already has
        return {**entry, "comments": [asdict(c) for c in new]}

    def on_step(self, state: dict[str, Any]) -> None:
        """Refresh the progress comment (throttled)."""
        self._progress(state)

    def _progress(self, state: dict[str, Any], *, force: bool = False) -> None:
        if self.ref is None or (not force and self.clock() - self._last_progress < self.progress_interval_s):
            return
        self._last_progress = self.clock()
        body = progress_body(self.uuid, state, self.labels, self.change_url, priced=self.priced)
        self.comment_id = self.forge.comment(self.ref, body, self.comment_id)

    def deliver(self, branch: str, summary: str, *, draft: bool = False) -> dict[str, Any]:
        """Open (or find) the pull/merge request of the task branch; ``draft``: the work of a task stopped by a limit,
        opened as a draft whose text (``summary``) says why."""
        owner, repo = self.request.task_key["owner"], self.request.task_key["repo"]
        first_line = summary.strip().splitlines()[0] if summary.strip() else "changes"
        title = self.item.title if self.item is not None and self.item.title else first_line
        if self.ref is not None:
            title = f"{title} (#{self.ref.number})"
        body = mask(summary.strip())
        if self.ref is not None and self.ref.kind == "issue":
            body += f"\n\nCloses #{self.ref.number}"
        body += f"\n\n<sub>opened by Tasuki · task `{self.uuid}`</sub>"
        body += "\n" + marker(self.request.task_key, branch, self.uuid)
        # A follow-up's branch already has its request: open_change finds it, no second one is opened.
        self.change_url = self.forge.open_change(owner, repo, branch, self.base_branch or "main",
                                                 mask(title)[:_TITLE_MAX], body, draft=draft)
        if draft:  # the review comments it was given are not addressed yet: they are not answered as if they were
            return {"pull_request_url": self.change_url, "draft": True}
        self._answer_review(summary)
        return {"pull_request_url": self.change_url}

    def _answer_review(self, summary: str) -> None:
        """One reply in each review thread the follow-up was given (all of them are what it worked on)."""
        if self.ref is None:
            return
        first = summary.strip().splitlines()[0] if summary.strip() else "see the pull request"
        for comment in self.review:
            body = mask(f"Addressed in the latest push to this branch: {first}\n\n<sub>task `{self.uuid}`</sub>")
            try:
                self.forge.reply_in_thread(self.ref, comment, body)
            except Exception as exc:
                log.warning("review thread not answered", comment=comment.id, error=mask(str(exc))[:200])

    def finish(self, status: str, state: dict[str, Any], result: dict[str, Any] | None, error: str | None) -> None:
        """Final label, final progress, summary comment; each tried even when another fails."""
        if self.ref is None:
            return
        ref = self.ref
        final = self.labels.done if status == "completed" else self.labels.failed
        steps: list[tuple[str, Callable[[], object]]] = [
            ("labels", lambda: self.forge.move_labels(ref, [final], [self.labels.processing, self.labels.trigger])),
            ("progress", lambda: self._final_progress(state)),
            ("summary", lambda: self.forge.comment(ref, summary_body(self.uuid, status, result, error))),
        ]
        failures = []
        for what, step in steps:
            try:
                step()
            except CredentialError:
                raise  # no token: every other step would be refused the same way
            except Exception as exc:
                failures.append(f"{what}: {mask(str(exc))[:200]}")
        if failures:
            raise TasukiError("; ".join(failures))

    def _final_progress(self, state: dict[str, Any]) -> None:
        if self.comment_id is None and self.ref is not None:  # finished without begin (gave up, cancelled)
            self.comment_id = find_comment(self.forge.read_item(self.ref).comments, MARKER.format(uuid=self.uuid))
        self._progress(state, force=True)

    def close(self) -> None:
        """Release the forge client's connections."""
        self.forge.close()


def reporter_for(settings: Settings, request: TaskRequest, uuid: str) -> ForgeReporter | None:
    """The reporter of a forge's task; None for a local one."""
    source = request.task_key.get("task_source")
    if source is None or not is_forge(source) or request.attempt:  # an attempt reports nothing: its parent does
        return None
    forge = make_forge(source, settings, request.task_key, request.trigger)
    section = forge_section(source, settings)
    return ForgeReporter(forge, request, uuid, section.labels, section.bot_login,
                         ci_log_lines=settings.followups.ci_log_lines, priced=settings.prices_known())


def report_outcome(settings: Settings, uuid: str, directory: Path) -> None:
    """Tell the forge how a task ended that no worker could report (the monitor failed it): final label,
    progress and summary. Raises when the forge could not be told."""
    metadata = read_json(directory / METADATA_FILE)
    request = TaskRequest.from_json(metadata.get("request") or {"task_key": metadata["task_key"],
                                                               "user": metadata.get("user")})
    reporter = reporter_for(settings, request, uuid)
    if reporter is None:
        return
    state = read_state(directory)
    try:
        reporter.finish(str(state["status"]), state, state.get("result"), state.get("error"))
    finally:
        reporter.close()


@on_ending("forge")
def _tell_the_forge(ending: Ending) -> None:
    """An ending no worker reported (the monitor's) reaches the issue too: final label, progress, summary."""
    if ending.reported or not is_forge(ending.task_key.get("task_source")):
        return
    from worker.runtime import context_store, settings

    s = settings()
    report_outcome(s, ending.uuid, context_store(s, index=False).completed_path(ending.uuid))
