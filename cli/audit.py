"""``tasuki audit`` (issue 40): who did what — the audit log's events, filtered, and ``--verify`` of its hash chain."""

from __future__ import annotations

import argparse
import json
import os
import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from cli.common import UsageError, out

if TYPE_CHECKING:
    from worker.settings_models import Settings

EXIT_OK = 0
EXIT_BROKEN_CHAIN = 65  # EX_DATAERR of sysexits.h: the log is there but a line was removed, altered or reordered
DEFAULT_LIMIT = 100
_RELATIVE = re.compile(r"(\d+)\s*([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def cli_actor() -> str:
    """Who runs this command, as the audit log names them: ``cli:<unix user>`` (the uid when it has no name)."""
    import getpass

    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # a container's uid without a passwd entry or $USER
        return f"cli:uid-{os.getuid()}"


def record_cli(settings: Settings, action: str, target: str, *, outcome: str = "ok", reason: str = "",
               detail: dict[str, Any] | None = None) -> None:
    """Record what this command did (or was refused) in the audit log, as the person at the terminal."""
    from worker.audit import record_audit

    record_audit(settings, actor=cli_actor(), action=action, target=target, outcome=outcome, reason=reason,
                 source="cli", detail=detail)


def audit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", metavar="WHEN",
                        help="events at or after WHEN: an ISO date or time (UTC unless it says) or an age: 30m, 2h, 7d")
    parser.add_argument("--actor", metavar="WHO", help="only this actor, e.g. cli:alice; * and ? match: 'github:*'")
    parser.add_argument("--action", metavar="A", help="only this action, e.g. task.cancel; 'task.*' matches several")
    parser.add_argument("--limit", type=int, default=DEFAULT_LIMIT, metavar="N",
                        help=f"the newest N events (default {DEFAULT_LIMIT}; 0: all), printed oldest first")
    parser.add_argument("--json", action="store_true", help="one JSON object per line, as stored")
    parser.add_argument("--verify", action="store_true",
                        help="check the hash chain; exit 65 naming the first removed, altered or reordered line")


def parse_when(text: str, now: datetime) -> datetime:
    """``--since``'s value: an age before ``now`` (``90m``, ``2h``, ``7d``) or an ISO date or time."""
    if match := _RELATIVE.fullmatch(text.strip()):
        return now - timedelta(**{_UNITS[match[2]]: int(match[1])})
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--since {text!r} is neither an ISO date or time nor an age such as 2h or 7d") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def cmd_audit(args: argparse.Namespace, settings: Settings) -> int:
    """List the events the filters select, or verify the chain (``--verify``)."""
    from contexts.audit import AuditQuery
    from worker.audit import audit_log

    if args.limit < 0:
        raise UsageError(f"--limit {args.limit} is negative (0 lists all)")
    backend = audit_log(settings)
    if args.verify:
        return _verify(backend, as_json=args.json)
    since = parse_when(args.since, datetime.now(UTC)) if args.since is not None else None
    query = AuditQuery(since=since, actor=args.actor, action=args.action, limit=args.limit)
    for line in backend.select(query):
        out(json.dumps(line, ensure_ascii=False, separators=(",", ":")) if args.json else format_line(line))
    return EXIT_OK


def _verify(backend: Any, *, as_json: bool) -> int:
    from cli.common import warn

    problems = backend.verify()
    if as_json:
        out(json.dumps({"ok": not problems, "problems": [
            {"line": p.line, "seq": p.seq, "message": p.message} for p in problems]}))
    elif not problems:
        out("audit log intact: every line chained to the one before")
    for problem in problems:
        warn(f"audit log broken at {problem}")
    return EXIT_BROKEN_CHAIN if problems else EXIT_OK


def format_line(line: dict[str, Any]) -> str:
    """One event on one line: time, actor, action, target, outcome and, when there is one, the reason."""
    from cli.viewer import safe

    at = str(line.get("at", ""))[:19].replace("T", " ") + "Z"
    cells = [at, str(line.get("actor", "")), str(line.get("action", "")), str(line.get("target", "")) or "-",
             str(line.get("outcome", ""))]
    if line.get("reason"):
        cells.append(f"({line['reason']})")
    return safe("  ".join(cells))
