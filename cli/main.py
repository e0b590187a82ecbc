"""The ``tasuki`` command (SPEC §10): argument parsing and a table of subcommands, each a small function.

A command is ``cmd_x(args, settings) -> int``, registered in :data:`COMMANDS` with the function that adds
its arguments; the work happens in the rooms (contexts, worker, scheduler) and the printing in
:mod:`cli.viewer`.

Exit codes: 0 done; 1 what was asked for does not exist (an unknown UUID, no context store, an
unreadable file); 2 bad input or configuration (a malformed UUID or date, a bad config value, a usage
error); 65 the audit log's hash chain is broken (``tasuki audit --verify``); 69 Redis does not answer;
70 an unexpected internal error (``--debug`` prints its traceback); 130 interrupted.
Errors are one line on stderr, ``tasuki: error: ...``; never a traceback unless ``--debug`` asks.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from cli import (
    audit,
    commands,
    context_requests,
    doctor,
    evals,
    fleet,
    github,
    init,
    memory,
    outcomes,
    reading,
    tokens,
    usage,
)
from cli.common import UsageError
from contexts.errors import ContextNotFoundError, TasukiError

if TYPE_CHECKING:
    from worker.settings_models import Settings

PROG = "tasuki"
EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE of sysexits.h: Redis does not answer
EXIT_INTERNAL = 70  # EX_SOFTWARE of sysexits.h
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # as a shell reports a process killed by SIGPIPE


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


# -- the table and the parser ----------------------------------------------------------------------

GROUPS: dict[tuple[str, ...], str] = {
    ("context",): "look into the context directories of tasks",
    ("memory",): "memory that outlives a task: episodes, thread and repository memories, recall",
    ("github",): "GitHub: the App manifest",
    ("fleet",): "many hosts: the fleet's store in PostgreSQL (fleet.store)",
    ("eval",): "evals: run task sets through the fleet, report resolve rate, cost and time",
    ("token",): "personal API tokens: make, list, revoke (the console's API tokens page, on the host)",
}

COMMANDS: list[Command] = [
    Command(("context", "list"), "contexts, newest first", reading.cmd_context_list, reading.list_arguments),
    Command(
        ("context", "reindex"),
        "rebuild the context index from every context directory",
        reading.cmd_context_reindex,
    ),
    Command(
        ("context", "show"),
        "one context: header, statistics, messages, summaries",
        reading.cmd_context_show,
        reading.show_arguments,
    ),
    Command(
        ("context", "request"),
        "the request one step sent to its model; --send PROFILE asks another model with it",
        context_requests.cmd_context_request,
        context_requests.request_arguments,
    ),
    Command(
        ("fleet", "import"),
        "copy a one-host store (contexts, their index, memory.db) into the fleet's PostgreSQL; idempotent",
        fleet.cmd_import,
        fleet.import_arguments,
    ),
    Command(("eval", "run"), "run a task set's rows as tasks (resumable with --name) and report",
            evals.cmd_eval_run, evals.run_arguments),
    Command(("eval", "report"), "an eval run's report; --predictions FILE in SWE-bench's format",
            evals.cmd_eval_report, evals.report_arguments),
    Command(("eval", "list"), "eval runs, newest first", evals.cmd_eval_list),
    Command(("eval", "mine"), "a task set from a repository's history: changes touching tests and code, checked "
            "in the sandbox", evals.cmd_eval_mine, evals.mine_arguments),
    Command(("github", "app-manifest"), "print the GitHub App manifest (permissions, events, webhook URL)",
            github.cmd_app_manifest, github.manifest_arguments),
    Command(("memory", "status"), "the memory store: counts, embedding model, last error", memory.cmd_status,
            memory.status_arguments),
    Command(("memory", "list"), "repositories with memory; with --repo, its episodes", memory.cmd_list,
            memory.list_arguments),
    Command(("memory", "show"), "a repository's memory and its thread memories", memory.cmd_show,
            memory.show_arguments),
    Command(("memory", "search"), "recall as a task would, with every score", memory.cmd_search,
            memory.search_arguments),
    Command(("memory", "forget"), "delete an episode, a thread or a repository from memory", memory.cmd_forget,
            memory.forget_arguments),
    Command(("memory", "prune"), "delete episodes older than memory.prune_after_days", memory.cmd_prune,
            memory.prune_arguments),
    Command(
        ("stats",),
        "statistics of the context store, optionally of matching tasks",
        reading.cmd_stats,
        reading.stats_arguments,
    ),
    Command(("usage",), "tokens and cost by repository, user, model or day (from the contexts)", usage.cmd_usage,
            usage.usage_arguments),
    Command(("outcomes",), "pull/merge requests tasks opened: merged, closed, open; cost per merged, time to merge",
            outcomes.cmd_outcomes, outcomes.outcomes_arguments),
    Command(("audit",), "who did what: the audit log's events, or --verify of its hash chain", audit.cmd_audit,
            audit.audit_arguments),
    Command(("token", "create"), "make a personal API token; its secret is printed once", tokens.cmd_token_create,
            tokens.create_arguments),
    Command(("token", "list"), "personal API tokens, newest first (never their secrets)", tokens.cmd_token_list,
            tokens.list_arguments),
    Command(("token", "revoke"), "revoke a personal API token", tokens.cmd_token_revoke, tokens.revoke_arguments),
    Command(("usage", "rebuild"), "rebuild today's daily budget counters in Redis from the contexts",
            usage.cmd_usage_rebuild),
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
    Command(
        ("console",),
        "the operators' web console alone: fleet, tasks, each task's context, live",
        commands.cmd_console,
        commands.console_arguments,
    ),
    Command(("demo",), "the main job end to end on embedded defaults", commands.cmd_demo, commands.demo_arguments),
    Command(("init",), "ask for the forge, model, sandbox and broker; write config.yaml and tasuki.env; run doctor",
            init.cmd_init, init.init_arguments),
    Command(("doctor",), "check every configured part (broker, contexts, model, forge, sandbox, store): OK or the fix",
            doctor.cmd_doctor, doctor.doctor_arguments),
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
        from evals.history import SourceUnreachable
        from memory.errors import MemoryUnavailable

        missing = ContextNotFoundError | MemoryUnavailable | SourceUnreachable
        return EXIT_NOT_FOUND if isinstance(exc, missing) else EXIT_USAGE
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
    from worker.settings import install_settings

    settings = _with_secrets_file(parsed.config)
    if settings.source.file is None:
        sys.stderr.write(f"{PROG}: note: {settings.source.describe()} (--config FILE or $TASUKI_CONFIG to choose)\n")
    settings = _broker_of_a_running_up(settings)
    # One settings object for this process and the file its children (celery, beat, webhook) read.
    install_settings(settings)
    # Reading commands print for a person; only warnings belong on stderr beside their output.
    configure_logging("DEBUG" if parsed.debug else "WARNING")
    code: int = parsed.run(parsed, settings)
    return code


def _with_secrets_file(config: str | None) -> Settings:
    """The settings, read after the ``tasuki.env`` beside the configuration file (the one ``tasuki init`` writes)
    is loaded into this process's environment, where a variable already set wins; its children inherit it."""
    import os
    from pathlib import Path

    from worker.env_file import load_beside
    from worker.settings import config_file, load_settings

    secrets = load_beside(config_file(config, os.environ, Path.cwd().absolute()), os.environ)
    settings = load_settings(config)
    return settings.with_source(settings.source._replace(secrets=secrets)) if secrets else settings


def _broker_of_a_running_up(settings: Settings) -> Settings:
    """When no ``broker.url`` is configured (or it does not answer) and ``tasuki up`` recorded its embedded Redis,
    use that one (and hand it to child processes). Costs nothing when no ``up`` ran here: only the file's absence
    is checked."""
    import os

    from cli.embedded import URL_FILE, recorded_broker, redis_answers

    if not (settings.local.var_dir / URL_FILE).is_file():
        return settings
    if settings.source.sets("broker", "url") and redis_answers(settings.broker.url):
        return settings
    url = recorded_broker(settings.local.var_dir)
    if url is None:
        return settings
    why = "does not answer" if settings.source.sets("broker", "url") else "is not configured"
    sys.stderr.write(f"{PROG}: note: broker.url {why}; using the embedded Redis of `tasuki up` at {url}\n")
    os.environ["TASUKI__BROKER__URL"] = url
    return settings.model_copy(update={"broker": settings.broker.model_copy(update={"url": url})})


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
