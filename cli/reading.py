"""Reading commands: ``context list``, ``context show`` and ``stats`` (001 §9), printed by :mod:`cli.viewer`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from cli.common import UsageError, note, out, parse_day, terminal_width, warn
from contexts.errors import CorruptRecordError
from contexts.names import ACTIVE_STATUSES, FINAL_STATUSES
from worker.stores import open_store

FOLLOWING_ELSEWHERE = "the context runs on another host of the fleet: following its committed steps"

if TYPE_CHECKING:
    from worker.settings_models import Settings

STATUSES = (*ACTIVE_STATUSES, *FINAL_STATUSES)
EXIT_OK = 0
PAGE = 50  # contexts `context list` shows unless --limit says otherwise
ALL = 2**62  # a page with no end (SQLite's LIMIT takes a 64-bit count)


def list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--status", choices=STATUSES, help="only contexts with this status")
    parser.add_argument("--user", metavar="USER", help="only contexts of this user")
    parser.add_argument("--limit", type=_count, default=PAGE, metavar="N", help=f"show N contexts (default {PAGE})")
    parser.add_argument("--offset", type=_count, default=0, metavar="N", help="skip the newest N first")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (0, 1, 2, ...)")
    return int(text)


def cmd_context_list(args: argparse.Namespace, settings: Settings) -> int:
    """Contexts, newest first, one page (from the index: the same cost at any number of completed contexts)."""
    from cli import viewer
    from contexts.queries import list_page

    page = list_page(open_store(settings), status=args.status, user=args.user, limit=args.limit, offset=args.offset)
    items = page.items
    out(viewer.to_json([item.to_json() for item in items]) if args.json else viewer.format_list(items))
    if len(items) < page.total:
        note(f"{len(items):,} of {page.total:,} contexts shown (--offset {args.offset}); --limit and --offset page")
    warn_damaged([{"uuid": damaged.uuid, "reason": damaged.reason} for damaged in page.damaged])
    return EXIT_OK


def cmd_context_reindex(_args: argparse.Namespace, settings: Settings) -> int:
    """Rebuild the context index from a scan of every context directory."""
    index = open_store(settings).index
    indexed = index.rebuild()
    damaged = index.damaged()
    out(f"indexed {indexed:,} contexts into {index.name}" + (f"; {len(damaged):,} damaged" if damaged else ""))
    warn_damaged([{"uuid": item.uuid, "reason": item.reason} for item in damaged])
    return EXIT_OK


def warn_damaged(damaged: list[dict[str, str]]) -> None:
    """One stderr line per context that was skipped because its files cannot be read."""
    for item in damaged:
        warn(f"skipped damaged context {item['uuid']}: {item['reason']}")


def show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uuid", metavar="UUID", help="the task's UUID")
    parser.add_argument("--messages", action="store_true", help="every message, in full")
    parser.add_argument("--summaries", action="store_true", help="every summary, in full")
    parser.add_argument("--tools", action="store_true", help="the tool calls")
    parser.add_argument("--follow", action="store_true", help="then print new messages until the task ends")
    parser.add_argument("--json", action="store_true", help="print the detail as JSON")


def cmd_context_show(args: argparse.Namespace, settings: Settings) -> int:
    """001 §9.1's viewer of one context, running, completed or gzipped."""
    from cli import viewer
    from cli.environment_view import setup_record
    from contexts.clock import utc_now
    from contexts.queries import readable, show_context

    if args.follow and args.json:
        raise UsageError("--follow prints lines as they come; it cannot be combined with --json")
    limit = None if args.messages or args.tools else viewer.SHOWN_BY_DEFAULT
    # A context on another host of the fleet is rebuilt from the durable copy into a temporary directory.
    host_store = open_store(settings)
    with readable(host_store, args.uuid) as (store, here):
        try:
            detail = show_context(store, args.uuid, limit=limit)
        except (ValueError, KeyError) as exc:  # a damaged metadata.json or state.json: bad data, not a bug
            raise CorruptRecordError(f"context {args.uuid} cannot be read: {type(exc).__name__}: {exc}") from exc
        setup = setup_record(store.locate(args.uuid))  # where the environment came from, a failed setup's lines
    if args.json:
        out(viewer.to_json(viewer.detail_json(detail)))
        return EXIT_OK
    width = terminal_width()
    flags = {"all_messages": args.messages, "all_summaries": args.summaries, "show_tools": args.tools}
    out(viewer.format_detail(detail, now=utc_now(), width=width, priced=settings.prices_known(), setup=setup, **flags))
    if args.follow and detail.summary.status not in FINAL_STATUSES:
        if not here:
            note(FOLLOWING_ELSEWHERE)
        out("")
        viewer.follow(host_store, detail.summary.uuid, detail.summary.message_count, out, width=width)
    return EXIT_OK


# -- stats -----------------------------------------------------------------------------------------


def stats_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--summary", action="store_true", help="only the report, without the matching tasks")
    parser.add_argument("--user", metavar="USER", help="only contexts of this user")
    parser.add_argument("--from", dest="date_from", metavar="YYYY-MM-DD", help="created on or after this UTC day")
    parser.add_argument("--to", dest="date_to", metavar="YYYY-MM-DD", help="created on or before this UTC day")
    parser.add_argument("--status", choices=STATUSES, help="only contexts with this status")
    parser.add_argument("--json", action="store_true", help="print JSON")


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    """001 §9.2's statistics; with filters, also the tasks that match (unless ``--summary``)."""
    from cli import viewer
    from contexts.queries import indexed_stats, list_page

    date_from, date_to = parse_day(args.date_from, "--from"), parse_day(args.date_to, "--to")
    if date_from and date_to and date_from > date_to:
        raise UsageError(f"--from {date_from} is after --to {date_to}")
    given = {"user": args.user, "status": args.status, "from": date_from, "to": date_to}
    filters = {key: str(value) for key, value in given.items() if value is not None}
    store = open_store(settings)
    stats = indexed_stats(store, user=args.user, status=args.status, date_from=date_from, date_to=date_to)
    matching = None
    if filters and not args.summary:  # every matching task: as long as the answer, not as the history
        everything = list_page(store, status=args.status, user=args.user, limit=ALL)
        matching = [item for item in everything.items if viewer.created_within(item, date_from, date_to)]
    if args.json:
        data = {"filters": filters, **stats.to_json()}
        if matching is not None:
            data["contexts"] = [item.to_json() for item in matching]
        out(viewer.to_json(data))
    else:
        out(viewer.format_stats(stats, filters, priced=settings.prices_known()))
        if matching is not None:
            out(f"\nTasks: {len(matching):,}\n{viewer.format_list(matching)}")
    warn_damaged(stats.damaged)
    return EXIT_OK
