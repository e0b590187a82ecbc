"""``tasuki outcomes`` (issue 28): what became of the pull/merge requests tasks opened, and what a merged one cost."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from cli.common import UsageError, out, parse_day

if TYPE_CHECKING:
    from contexts.outcomes import OutcomeRow
    from worker.settings_models import Settings

EXIT_OK = 0
_HEADERS = ("OPENED", "MERGED", "CLOSED", "OPEN", "MERGE RATE", "COST/MERGED", "TO MERGE (MEDIAN)", "FOLLOW-UPS/PR")


def outcomes_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", metavar="R", help="only this repository: source/owner/name, e.g. github/acme/api")
    parser.add_argument("--from", dest="date_from", metavar="YYYY-MM-DD", help="opened on or after this UTC day")
    parser.add_argument("--to", dest="date_to", metavar="YYYY-MM-DD", help="opened on or before this UTC day")
    parser.add_argument("--by", choices=("repo", "model", "week"), default=None,
                        help="group by repository, model or week opened (weeks by their Monday)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def cmd_outcomes(args: argparse.Namespace, settings: Settings) -> int:
    """Opened, merged, closed unmerged and still open; merge rate, cost per merged request, median time to merge,
    follow-ups per request; from the outcome store, never the contexts."""
    from cli import viewer
    from contexts.outcomes import Selection, report
    from worker.stores import find_outcomes

    date_from, date_to = parse_day(args.date_from, "--from"), parse_day(args.date_to, "--to")
    if date_from and date_to and date_from > date_to:
        raise UsageError(f"--from {date_from} is after --to {date_to}")
    if args.repo is not None and (args.repo.count("/") != 2 or not all(args.repo.split("/"))):
        raise UsageError(f"--repo {args.repo!r} is not source/owner/name (e.g. github/acme/api)")
    store = find_outcomes(settings)
    rows: list[OutcomeRow] = []
    total = None
    if store is not None:
        try:
            rows, total = report(store, args.by, Selection(args.repo, date_from, date_to))
        finally:
            store.close()
    priced = settings.prices_known()
    if args.json:
        out(viewer.to_json({"by": args.by, "priced": priced, "rows": [row.to_json() for row in rows],
                            "total": total.to_json() if total else None}))
    elif total is None or total.opened == 0:
        out("No pull/merge request opened by a task in this selection.")
    else:
        out(format_rows(args.by, rows, total, priced))
    return EXIT_OK


def _cells(row: OutcomeRow, priced: bool) -> tuple[str, ...]:
    from cli.viewer import format_duration
    from contexts.usage import format_cost

    rate = f"{row.merge_rate * 100:.0f} %" if row.merge_rate is not None else "-"
    if not priced or row.cost_usd is None:
        cost = format_cost(None, priced)
    else:
        cost = f"${row.cost_per_merged_usd:.4f}" if row.cost_per_merged_usd is not None else "no merge"
    followups = f"{row.followups_per_pr:.2f}" if row.followups_per_pr is not None else "-"
    return (f"{row.opened:,}", f"{row.merged:,}", f"{row.closed_unmerged:,}", f"{row.still_open:,}", rate, cost,
            format_duration(row.median_time_to_merge_s), followups)


def format_rows(by: str | None, rows: list[OutcomeRow], total: OutcomeRow, priced: bool) -> str:
    """The table ``tasuki outcomes`` prints: one line per group and the total (the total alone without ``--by``)."""
    from cli.viewer import safe

    label = (by or "").upper()
    lines = [*(((safe(row.key),), _cells(row, priced)) for row in (rows if by else [])),
             (("total",), _cells(total, priced))]
    width = max(len(label), *(len(key[0]) for key, _ in lines))
    widths = [max(len(h), *(len(cells[i]) for _, cells in lines)) for i, h in enumerate(_HEADERS)]
    head = f"{label:<{width}}  " + "  ".join(f"{h:>{w}}" for h, w in zip(_HEADERS, widths, strict=True))
    body = [f"{key[0]:<{width}}  " + "  ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True))
            for key, cells in lines]
    notes = ["merge rate: merged / (merged + closed unmerged); cost per merged: the spend of every request in the "
             "selection (first task and follow-ups) / the merged ones; time to merge: from the first task's start"]
    return "\n".join([head.rstrip(), *body, *notes])
