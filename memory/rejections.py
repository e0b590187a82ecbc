"""What reviewers rejected (SPEC §13, issue 28): a pull/merge request closed unmerged leaves its last review in the
repository memory as a fact, with the tasks it came from, so that the next task on the repository is told.

Written as it was said, no model in between: the next repository merge reads it as part of the existing memory
and keeps it or condenses it like any other fact. Within ``repo_max_tokens``: the oldest rejections make room
first, then the review is cut.
"""

from __future__ import annotations

from datetime import datetime

from contexts.outcomes import REVIEW_CHARS, PullOutcome
from contexts.tokens import estimate_tokens
from memory.records import Memory

PREFIX = "- Reviewers rejected "


def rejection_line(outcome: PullOutcome, chars: int = REVIEW_CHARS) -> str | None:
    """The fact a closed-unmerged request leaves: where, when, what its reviewers said, its tasks; None when no
    review was recorded."""
    remarks = []
    for entry in outcome.last_review:
        where = f" on {entry['path']}:{entry.get('line') or '?'}" if entry.get("path") else ""
        body = " ".join(str(entry.get("body") or "").split())
        if body:
            remarks.append(f"{entry.get('author') or 'a reviewer'}{where}: \"{body}\"")
    if not remarks:
        return None
    said = "; ".join(remarks)
    said = said if len(said) <= chars else said[: chars - 1] + "…"
    when = outcome.closed_at.date().isoformat() if outcome.closed_at else "?"
    tasks = ", ".join(outcome.tasks or (outcome.first_uuid,))
    return f"{PREFIX}{outcome.url or outcome.pull} (closed unmerged {when}): {said} ({tasks})"


def with_rejection(existing: Memory | None, outcome: PullOutcome, repository: str, max_tokens: int,
                   now: datetime) -> Memory | None:
    """The repository memory with the request's rejection in it (replacing an earlier line of the same request);
    None when there is no review to remember."""
    line = rejection_line(outcome)
    if line is None:
        return None
    name = f"{PREFIX}{outcome.url or outcome.pull} "
    kept = [text for text in (existing.text.splitlines() if existing else []) if not text.startswith(name)]
    while kept and estimate_tokens("\n".join([*kept, line])) > max_tokens:
        oldest = next((i for i, text in enumerate(kept) if text.startswith(PREFIX)), None)
        if oldest is None:
            break
        del kept[oldest]
    chars = REVIEW_CHARS
    while estimate_tokens("\n".join([*kept, line])) > max_tokens and chars > 80:
        chars //= 2
        line = rejection_line(outcome, chars) or line
    sources = (*(existing.sources if existing else ()), *(outcome.tasks or (outcome.first_uuid,)))
    return Memory("repository", repository, "\n".join([*kept, line]), now, tuple(dict.fromkeys(sources)))
