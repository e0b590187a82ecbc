"""The ``tasuki`` command (SPEC §10): argument parsing and a table of subcommands, each a small function.

A command is ``cmd_x(args, settings) -> int``, registered in :data:`COMMANDS` with the function that adds
its arguments; the work happens in the rooms (contexts, worker, scheduler) and the printing in
:mod:`worker.viewer`.

Exit codes: 0 done; 1 what was asked for does not exist (an unknown UUID, no context store, an
unreadable file); 2 bad input or configuration (a malformed UUID or date, a bad config value, a usage
error); 69 Redis does not answer; 70 an unexpected internal error (``--debug`` prints its traceback); 130 interrupted.
Errors are one line on stderr, ``tasuki: error: ...``; never a traceback unless ``--debug`` asks.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from contexts.errors import ContextNotFoundError, CorruptRecordError, InvalidUUIDError, TasukiError
from contexts.names import ACTIVE_STATUSES, FINAL_STATUSES
from worker import commands
from worker.commands import out

if TYPE_CHECKING:
    from contexts.store import ContextStore
    from worker.settings_models import Settings

PROG = "tasuki"
EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE of sysexits.h: Redis does not answer
EXIT_INTERNAL = 70  # EX_SOFTWARE of sysexits.h
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # as a shell reports a process killed by SIGPIPE
STATUSES = (*ACTIVE_STATUSES, *FINAL_STATUSES)
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


class UsageError(TasukiError):
    """The command line itself is wrong: an unknown option, a malformed date, conflicting flags."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, like every other error of the command."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


CommandFn = Callable[[argparse.Namespace, "Settings"], int]


@dataclass(frozen=True)
class Command:
    """One subcommand: its words (``("context", "show")``), a one-line help, its arguments, its function."""

    path: tuple[str, ...]
    help: str
    run: CommandFn
    arguments: Callable[[argparse.ArgumentParser], None] | None = None


# -- helpers the commands share --------------------------------------------------------------------


def terminal_width() -> int:
    """Columns to fit one-line views into (``$COLUMNS`` when set, 100 when not a terminal)."""
    return max(shutil.get_terminal_size((100, 24)).columns, 40)


def open_store(settings: Settings) -> ContextStore:
    """The configured context store, which must already exist (reading never creates one elsewhere)."""
    base = Path(settings.contexts.base_dir)
    if not base.is_dir():
        raise ContextNotFoundError(f"no context store at {base.absolute()} (contexts.base_dir)")
    from contexts.store import ContextStore

    # Not worker.runtime.context_store: reading needs no Redis heartbeat index, nor the import of redis.
    config = settings.contexts
    return ContextStore(
        base,
        heartbeat_interval_s=config.heartbeat_interval_s,
        stale_after_s=config.stale_after_s,
        fsync=config.fsync,
    )


def locate_inside(store: ContextStore, uuid: str) -> Path:
    """The directory of ``uuid``; refuses one that resolves outside the contexts root (a symlink)."""
    directory = store.locate(uuid)  # also rejects anything that is not a canonical UUID, e.g. ../../etc
    root = store.base_dir.resolve()
    if not directory.resolve().is_relative_to(root):
        raise InvalidUUIDError(f"context {uuid} leads outside the contexts root {root}")
    return directory


def parse_day(text: str | None, option: str) -> date | None:
    """A ``YYYY-MM-DD`` option value as a date; a one-line error when it is not one."""
    if text is None:
        return None
    try:
        if not _DAY.fullmatch(text):
            raise ValueError("expected YYYY-MM-DD")
        return date.fromisoformat(text)
    except ValueError as exc:
        raise UsageError(f"{option} {text!r} is not a date: {exc}") from None


# -- context list / show ---------------------------------------------------------------------------


def _list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--status", choices=STATUSES, help="only contexts with this status")
    parser.add_argument("--user", metavar="USER", help="only contexts of this user")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def cmd_context_list(args: argparse.Namespace, settings: Settings) -> int:
    """Contexts, newest first."""
    from contexts.queries import list_contexts
    from worker import viewer

    items = list_contexts(open_store(settings), status=args.status, user=args.user)
    out(viewer.to_json([item.to_json() for item in items]) if args.json else viewer.format_list(items))
    return EXIT_OK


def _show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uuid", metavar="UUID", help="the task's UUID")
    parser.add_argument("--messages", action="store_true", help="every message, in full")
    parser.add_argument("--summaries", action="store_true", help="every summary, in full")
    parser.add_argument("--tools", action="store_true", help="the tool calls")
    parser.add_argument("--follow", action="store_true", help="then print new messages until the task ends")
    parser.add_argument("--json", action="store_true", help="print the detail as JSON")


def cmd_context_show(args: argparse.Namespace, settings: Settings) -> int:
    """001 §9.1's viewer of one context, running, completed or gzipped."""
    from contexts.clock import utc_now
    from contexts.queries import show_context
    from worker import viewer

    if args.follow and args.json:
        raise UsageError("--follow prints lines as they come; it cannot be combined with --json")
    store = open_store(settings)
    locate_inside(store, args.uuid)
    limit = None if args.messages or args.tools else viewer.SHOWN_BY_DEFAULT
    try:
        detail = show_context(store, args.uuid, limit=limit)
    except (ValueError, KeyError) as exc:  # a damaged metadata.json or state.json: bad data, not a bug
        raise CorruptRecordError(f"context {args.uuid} cannot be read: {type(exc).__name__}: {exc}") from exc
    if args.json:
        out(viewer.to_json(viewer.detail_json(detail)))
        return EXIT_OK
    width = terminal_width()
    flags = {"all_messages": args.messages, "all_summaries": args.summaries, "show_tools": args.tools}
    out(viewer.format_detail(detail, now=utc_now(), width=width, **flags))
    if args.follow and detail.summary.status not in FINAL_STATUSES:
        out("")
        viewer.follow(store, detail.summary.uuid, detail.summary.message_count, out, width=width)
    return EXIT_OK


# -- stats -----------------------------------------------------------------------------------------


def _stats_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--summary", action="store_true", help="only the report, without the matching tasks")
    parser.add_argument("--user", metavar="USER", help="only contexts of this user")
    parser.add_argument("--from", dest="date_from", metavar="YYYY-MM-DD", help="created on or after this UTC day")
    parser.add_argument("--to", dest="date_to", metavar="YYYY-MM-DD", help="created on or before this UTC day")
    parser.add_argument("--status", choices=STATUSES, help="only contexts with this status")
    parser.add_argument("--json", action="store_true", help="print JSON")


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    """001 §9.2's statistics; with filters, also the tasks that match (unless ``--summary``)."""
    from contexts.queries import compute_stats, list_contexts
    from worker import viewer

    date_from, date_to = parse_day(args.date_from, "--from"), parse_day(args.date_to, "--to")
    if date_from and date_to and date_from > date_to:
        raise UsageError(f"--from {date_from} is after --to {date_to}")
    given = {"user": args.user, "status": args.status, "from": date_from, "to": date_to}
    filters = {key: str(value) for key, value in given.items() if value is not None}
    store = open_store(settings)
    stats = compute_stats(store, user=args.user, status=args.status, date_from=date_from, date_to=date_to)
    matching = None
    if filters and not args.summary:
        matching = [
            item
            for item in list_contexts(store, status=args.status, user=args.user)
            if viewer.created_within(item, date_from, date_to)
        ]
    if args.json:
        data = {"filters": filters, **stats.to_json()}
        if matching is not None:
            data["contexts"] = [item.to_json() for item in matching]
        out(viewer.to_json(data))
    else:
        out(viewer.format_stats(stats, filters))
        if matching is not None:
            out(f"\nTasks: {len(matching):,}\n{viewer.format_list(matching)}")
    return EXIT_OK


# -- the table and the parser ----------------------------------------------------------------------

GROUPS: dict[tuple[str, ...], str] = {("context",): "look into the context directories of tasks"}

COMMANDS: list[Command] = [
    Command(("context", "list"), "contexts, newest first", cmd_context_list, _list_arguments),
    Command(
        ("context", "show"), "one context: header, statistics, messages, summaries", cmd_context_show, _show_arguments
    ),
    Command(("stats",), "statistics of the context store, optionally of matching tasks", cmd_stats, _stats_arguments),
    Command(
        ("worker",),
        "a Celery worker on the tasks, compression and maintenance queues",
        commands.cmd_worker,
        commands.worker_arguments,
    ),
    Command(("submit",), "enqueue a task", commands.cmd_submit, commands.submit_arguments),
    Command(
        ("cancel",),
        "stop a task at its next step (or revoke it while queued)",
        commands.cmd_cancel,
        commands.cancel_arguments,
    ),
    Command(
        ("up",),
        "worker, beat and webhook on one machine (embedded Redis if none answers)",
        commands.cmd_up,
        commands.up_arguments,
    ),
    Command(("beat",), "the scheduler: monitor, retention, alerts", commands.cmd_beat, commands.beat_arguments),
    Command(
        ("reap",),
        "one monitor pass: resume or fail lost tasks, repair interrupted completions",
        commands.cmd_reap,
        commands.dry_run_arguments,
    ),
    Command(
        ("retention",), "gzip and delete completed contexts by age", commands.cmd_retention, commands.dry_run_arguments
    ),
    Command(("alerts",), "disk use, failure rate, running and long-running tasks", commands.cmd_alerts),
    Command(
        ("webhook",),
        "the HTTP intake: webhooks, task API, /healthz, /metrics",
        commands.cmd_webhook,
        commands.webhook_arguments,
    ),
    Command(("demo",), "the main job end to end on embedded defaults", commands.cmd_demo),
    Command(
        ("replay-model",),
        "serve a recorded or scripted trajectory as an OpenAI/Ollama model",
        commands.cmd_replay_model,
        commands.replay_arguments,
    ),
]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tasuki")
    except PackageNotFoundError:
        return "unknown"


def build_parser(commands: Sequence[Command] = COMMANDS) -> argparse.ArgumentParser:
    """The ``tasuki`` parser with one (nested) subparser per command of ``commands``."""
    parser = _Parser(prog=PROG, description="Run coding agents as a fleet, and look into their contexts.")
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    parser.add_argument("--config", metavar="PATH", help="config.yaml to read (default: $TASUKI_CONFIG, ./config.yaml)")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an unexpected error")
    parser.set_defaults(run=None, parser=parser)
    parsers: dict[tuple[str, ...], argparse.ArgumentParser] = {(): parser}
    actions: dict[tuple[str, ...], argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    for command in commands:
        for depth in range(1, len(command.path) + 1):
            key = command.path[:depth]
            if key in parsers:
                continue
            if key[:-1] not in actions:
                actions[key[:-1]] = parsers[key[:-1]].add_subparsers(title="commands", metavar="COMMAND")
            leaf = depth == len(command.path)
            text = command.help if leaf else GROUPS.get(key, "")
            sub = actions[key[:-1]].add_parser(key[-1], help=text, description=text)
            # Accepted after the command words too; SUPPRESS keeps a --debug given before them.
            sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
            sub.set_defaults(run=command.run if leaf else None, parser=sub)
            parsers[key] = sub
        if command.arguments is not None:
            command.arguments(parsers[command.path])
    return parser


# -- main ------------------------------------------------------------------------------------------


def _error(message: str) -> None:
    from contexts.masking import mask

    for line in mask(message).strip().splitlines() or [""]:  # a ConfigError lists one problem per line
        sys.stderr.write(f"{PROG}: error: {line}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tasuki`` with ``argv`` (default: the process's arguments); returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return _run(build_parser(), args)
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except Exception as exc:
        return _report(exc, debug="--debug" in args)


def _report(exc: Exception, *, debug: bool) -> int:
    """Say what went wrong in one line on stderr; return the exit code it means."""
    if debug:
        traceback.print_exc()
    if isinstance(exc, TasukiError):
        _error(str(exc))
        return EXIT_NOT_FOUND if isinstance(exc, ContextNotFoundError) else EXIT_USAGE
    if _broker_down(exc):
        _error(f"Redis does not answer ({_first_line(exc)}); check broker.url, or run `tasuki up`, which starts one")
        return EXIT_UNAVAILABLE
    if isinstance(exc, OSError):  # a file the store could not read: permissions, a vanished disk
        _error(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))
        return EXIT_NOT_FOUND
    first = (str(exc).strip().splitlines() or [""])[0]
    _error(f"unexpected {type(exc).__name__}: {first} (run with --debug for the traceback)")
    return EXIT_INTERNAL


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _broker_down(exc: BaseException) -> bool:
    """A Redis or broker connection failure (whatever layer raised it), not a bug of ours."""
    import redis
    from kombu.exceptions import OperationalError

    return isinstance(exc, redis.ConnectionError | redis.TimeoutError | OperationalError)


def _run(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    parsed, unknown = parser.parse_known_args(argv)
    if unknown:
        if not getattr(parsed, "passthrough", False):
            parsed.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        parsed.celery_args = [*parsed.celery_args, *unknown]
    if parsed.run is None:  # `tasuki` or `tasuki context` alone
        parsed.parser.print_help(sys.stderr)
        return EXIT_USAGE
    from worker.logging import configure_logging
    from worker.settings import load_settings

    settings = load_settings(parsed.config)
    # Reading commands print for a person; only warnings belong on stderr beside their output.
    configure_logging("DEBUG" if parsed.debug else "WARNING")
    code: int = parsed.run(parsed, settings)
    return code


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again on the closed pipe."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    raise SystemExit(main())
