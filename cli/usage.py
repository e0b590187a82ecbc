"""Spend commands (SPEC §16): ``tasuki usage`` over the contexts, ``tasuki usage rebuild`` of today's counters."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from cli.common import UsageError, out, parse_day
from cli.reading import warn_damaged
from contexts.usage import format_cost
from worker.stores import open_store

if TYPE_CHECKING:
    from contexts.usage_report import UsageRow
    from worker.settings_models import Settings

EXIT_OK = 0


def usage_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", metavar="R", help="only this repository: source/owner/name, e.g. github/acme/api")
    parser.add_argument("--user", metavar="USER", help="only tasks of this user")
    parser.add_argument("--from", dest="date_from", metavar="YYYY-MM-DD", help="spent on or after this UTC day")
    parser.add_argument("--to", dest="date_to", metavar="YYYY-MM-DD", help="spent on or before this UTC day")
    parser.add_argument("--by", choices=("repo", "user", "model", "day"), default="repo",
                        help="group by (repo); model: PROFILE: MODEL, the model profile and the model that answered")
    parser.add_argument("--json", action="store_true", help="print JSON")


def cmd_usage(args: argparse.Namespace, settings: Settings) -> int:
    """Tokens and cost grouped by repository, user, model or day, from the contexts."""
    from cli import viewer
    from contexts.queries import every_summary
    from contexts.usage_report import usage_rows

    date_from, date_to = parse_day(args.date_from, "--from"), parse_day(args.date_to, "--to")
    if date_from and date_to and date_from > date_to:
        raise UsageError(f"--from {date_from} is after --to {date_to}")
    listing = every_summary(open_store(settings))
    rows = usage_rows(listing.items, by=args.by, repo=args.repo, user=args.user, date_from=date_from,
                      date_to=date_to)
    priced = settings.prices_known()
    if args.json:
        total_cost = [row.cost_usd for row in rows if row.cost_usd is not None]
        out(viewer.to_json({"by": args.by, "priced": priced, "rows": [row.to_json() for row in rows],
                            "tokens": sum(row.tokens for row in rows),
                            "cost_usd": round(sum(total_cost), 9) if total_cost else None}))
    else:
        out(format_rows(args.by, rows, priced))
    warn_damaged([{"uuid": damaged.uuid, "reason": damaged.reason} for damaged in listing.damaged])
    return EXIT_OK


def format_rows(by: str, rows: list[UsageRow], priced: bool) -> str:
    """The table ``tasuki usage`` prints; every cost figure says why when there is none."""
    from cli.viewer import safe

    if not rows:
        return "No model calls recorded for this selection."
    width = max(len(by), *(len(safe(row.key)) for row in rows))
    lines = [f"{by.upper():<{width}}  {'TASKS':>6}  {'TOKENS':>14}  COST"]
    for row in rows:
        cost = format_cost(row.cost_usd, priced)
        lines.append(f"{safe(row.key):<{width}}  {row.tasks:>6,}  {row.tokens:>14,}  {cost}")
    costs = [row.cost_usd for row in rows if row.cost_usd is not None]
    total = format_cost(sum(costs) if costs else None, priced)
    lines.append(f"{'total':<{width}}  {'':>6}  {sum(row.tokens for row in rows):>14,}  {total}")
    return "\n".join(lines)


def cmd_usage_rebuild(args: argparse.Namespace, settings: Settings) -> int:
    """Rebuild today's (UTC) daily counters in Redis from the contexts (after Redis lost them)."""
    from contexts.clock import utc_now
    from contexts.queries import every_summary
    from contexts.usage_report import day_counters
    from worker.runtime import redis_client
    from worker.spend import rebuild_day

    today = utc_now().date()
    listing = every_summary(open_store(settings))
    repos, users = day_counters(listing.items, today)
    rebuild_day(redis_client(), today.isoformat(), repos, users)
    out(f"Rebuilt the counters of {today} (UTC): {len(repos)} repositories, {len(users)} users.")
    priced = settings.prices_known()
    for repo, (tokens, cost) in sorted(repos.items()):
        out(f"  {repo}: {tokens:,} tokens, {format_cost(cost if priced else None, priced)}")
    for user, tasks in sorted(users.items()):
        out(f"  {user}: {tasks} task{'s' if tasks != 1 else ''}")
    warn_damaged([{"uuid": damaged.uuid, "reason": damaged.reason} for damaged in listing.damaged])
    return EXIT_OK
