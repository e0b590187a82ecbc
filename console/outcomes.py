"""The fleet page's outcomes panel (issue 28): the last weeks' pull/merge requests tasks opened — merged, closed
unmerged, still open — with their merge rate, cost per merged request and median time to merge, and a weekly chart.
Read from the outcome store (one aggregate per week), never from the contexts."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from datetime import UTC, date, datetime

from contexts.errors import ContextError
from contexts.outcomes import OutcomeRow, OutcomeStore, Selection, report, weekly
from worker.settings_models import Settings
from worker.stores import find_outcomes

WEEKS = 12


@dataclass(frozen=True)
class OutcomesPanel:
    """The panel: the weeks' totals and one row per week (oldest first)."""

    total: OutcomeRow
    weeks: list[OutcomeRow]
    since: date

    def chart_json(self) -> str:
        """The data the page's chart script reads (a JSON attribute, never executed): each week's Monday in epoch
        seconds and its requests opened, merged and closed unmerged (by the week they were opened)."""
        mondays = [datetime.fromisoformat(row.key).replace(tzinfo=UTC).timestamp() for row in self.weeks]
        return json.dumps({"weeks": mondays, "opened": [row.opened for row in self.weeks],
                           "merged": [row.merged for row in self.weeks],
                           "closed": [row.closed_unmerged for row in self.weeks]})


class OutcomesReader:
    """The console's one connection to the outcome store, opened once there is a store to read."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.lock = threading.Lock()
        self.store: OutcomeStore | None = None

    def __call__(self, now: datetime) -> OutcomesPanel | None:
        """The panel as of ``now``; None while no request was ever recorded or the store cannot be read."""
        with self.lock:
            try:
                if self.store is None:
                    self.store = find_outcomes(self.settings)
                if self.store is None:
                    return None
                weeks = weekly(self.store, now, WEEKS)
                since = date.fromisoformat(weeks[0].key)
                _, total = report(self.store, None, Selection(since=since))
            except ContextError:
                return None
        return OutcomesPanel(total, weeks, since) if total.opened else None

