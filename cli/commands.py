"""The commands that run things: worker, submit, cancel, up, demo, replay-model (SPEC §10).

Each is ``cmd_x(args, settings) -> int`` like the reading commands in :mod:`cli.main`, which lists them.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cli.audit import record_cli
from cli.common import out
from contexts.errors import TasukiError
from contexts.repositories import NotARepositoryError, local_repository
from worker.attempts import MAX_ATTEMPTS

if TYPE_CHECKING:
    from worker.settings_models import Settings


# -- worker ----------------------------------------------------------------------------------------


def worker_arguments(parser: argparse.ArgumentParser) -> None:
    # Every other option is passed to `celery worker` as it is (collected by the CLI's parse_known_args).
    parser.set_defaults(celery_args=[], passthrough=True)


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    """``celery -A worker worker`` on Tasuki's queues, and beside it the compression worker (threads) when the
    compression queue is among them; one of them alone replaces this process."""
    import threading

    from cli.services import Service, child_env, stop_all, stop_on_signals, until_one_exits, worker_processes

    processes = worker_processes(args.celery_args, settings.compression.concurrency)
    if len(processes) == 1:
        os.execv(sys.executable, processes[0][1])  # noqa: S606 - a fixed program: this interpreter running celery
    env = child_env({})
    # Output is passed through untouched (JSON log lines stay JSON); SIGTERM reaches both at once, and the task
    # worker gets its whole hand-back grace before anything is killed.
    services = [Service(name, argv, env) for name, argv in processes]
    stopping = threading.Event()
    with stop_on_signals(stopping):
        try:
            for service in services:
                service.start()
            return until_one_exits(services, stopping, out)
        finally:
            stop_all(services, timeout_s=settings.agent.shutdown_grace_s + 30)


# -- submit, cancel ----------------------------------------------------------------------------------


def submit_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--repo", metavar="OWNER/NAME", help="a GitHub, GitLab or Gitea repository")
    where.add_argument("--repo-path", metavar="PATH", help="a local git repository")
    parser.add_argument("--issue", type=int, metavar="N", help="the issue to work on (with --repo)")
    parser.add_argument("--source", choices=("github", "gitlab", "gitea"), default="github",
                        help="where --repo lives")
    parser.add_argument("--prompt", metavar="TEXT", default="", help="what to do (local tasks: required)")
    parser.add_argument("--user", metavar="USER", help="who asked (recorded in metadata.json)")
    parser.add_argument("--model", metavar="NAME",
                        help="the model profile (llm.models) to run with; default: the repository's, else llm.default")
    parser.add_argument("--attempts", type=attempt_count, metavar="N",
                        help="agents on separate branches, the best one delivered (1-8; default: attempts settings)")
    parser.add_argument("--wait", action="store_true", help="show progress until the task finishes")


def attempt_count(text: str) -> int:
    """``--attempts``: a whole number from 1 to 8 (docs/attempts.md)."""
    if not text.isdigit() or not 1 <= int(text) <= MAX_ATTEMPTS:
        raise argparse.ArgumentTypeError(f"a number from 1 to {MAX_ATTEMPTS}")
    return int(text)


def build_request(args: argparse.Namespace) -> dict[str, object]:
    """The ``run_task`` request for the command line's arguments."""
    if args.repo_path:
        # Its resolved real path is its identity: `../x`, its absolute path and a symlink to it are one repository
        # (one environment, one snapshot, one operator entry).
        try:
            path = local_repository(args.repo_path)
        except NotARepositoryError as exc:
            raise NotARepositoryError(f"--repo-path {exc}") from None
        if not args.prompt:
            raise TasukiError("a local task needs --prompt")
        return {
            # One active task per key (SPEC §2): the same prompt on the same repository is one task.
            "task_key": {"task_source": "local", "owner": "local", "repo": path.name, "task_type": "prompt",
                         "task_id": "p" + hashlib.sha256(args.prompt.encode()).hexdigest()[:8]},
            "repo_path": str(path),
            "prompt": args.prompt,
            "user": args.user,
        }
    if args.issue is None or "/" not in args.repo:
        raise TasukiError("--repo OWNER/NAME needs --issue N")
    owner, name = args.repo.rsplit("/", 1)
    return {
        "task_key": {"task_source": args.source, "owner": owner, "repo": name, "task_type": "issue",
                     "task_id": str(args.issue)},
        "prompt": args.prompt,
        "user": args.user,
    }


def cmd_submit(args: argparse.Namespace, settings: Settings) -> int:
    """Enqueue a task; with ``--wait`` follow it to the end."""
    from cli.progress import watch
    from worker.celery import app
    from worker.runtime import context_store, redis_client
    from worker.submit import enqueue

    request = build_request(args)
    if getattr(args, "model", None):
        from worker.profiles import PROFILE_KEY, check_profile

        request["config"] = {PROFILE_KEY: check_profile(settings, args.model)}  # an unknown one: one line, exit 1
    if getattr(args, "attempts", None):
        request["attempts"] = args.attempts
    key = request["task_key"]
    try:
        queued = enqueue(app, redis_client(), settings, request)
    except TasukiError as exc:  # a budget or admission refusal: who tried is kept too
        record_cli(settings, "task.submit", "", outcome="refused", reason=str(exc), detail={"task_key": key})
        raise
    record_cli(settings, "task.submit", queued.uuid,
               detail={"task_key": key, "user": request.get("user"), "already_active": queued.already_active})
    if queued.already_active:
        out(f"{queued.uuid} (a task for this issue is already queued or running)")
    else:
        out(queued.uuid)
    if not args.wait:
        return 0
    state = watch(context_store(settings, index=False), queued.uuid, out, stopped=lambda: stop_of(queued.uuid))
    if state is None:
        return 1
    for line in outcome_lines(state, args.repo_path):
        out(line)
    return 0 if state.get("status") == "completed" else 1


def stop_of(uuid: str) -> dict[str, object] | None:
    """How a worker ended the task when its context could not be finished (a full disk), if it did."""
    import redis

    from worker.bookkeeping import stopped
    from worker.runtime import redis_client

    try:
        return stopped(redis_client(), uuid)
    except redis.RedisError:
        return None  # Redis is not answering: the context files still say how the task ends


def outcome_lines(state: dict[str, object], repo_path: str | None) -> list[str]:
    """How a watched task ended: its (masked) error, the branch it pushed, the pull/merge request."""
    from contexts.masking import mask

    lines = []
    if state.get("status") != "completed":
        lines.append(f"{state.get('status')}: {mask(str(state.get('error') or 'no error recorded'))}")
    result = state.get("result")
    if isinstance(result, dict):
        if result.get("branch"):
            where = f" in {Path(repo_path).resolve()}" if repo_path else ""
            lines.append(f"branch: {result['branch']}{where}")
        if result.get("pull_request_url"):
            lines.append(f"pull request: {result['pull_request_url']}")
        if result.get("unchanged"):
            lines.append("no changes: nothing was pushed")
        if result.get("left_out"):
            lines.append(str(result["left_out"]))
    return lines


def cancel_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uuid", metavar="UUID", help="the task's UUID")


def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    """Stop a task at its next step, or revoke it while queued."""
    from worker.celery import app
    from worker.runtime import context_store, redis_client
    from worker.submit import request_cancel

    try:
        done = request_cancel(app, redis_client(), context_store(settings, index=False), args.uuid)
    except TasukiError as exc:  # an unknown or finished task: the attempt is recorded as refused
        record_cli(settings, "task.cancel", args.uuid, outcome="refused", reason=str(exc))
        raise
    record_cli(settings, "task.cancel", args.uuid, detail={"result": done})
    out(done)
    return 0


# -- beat, reap, retention, alerts (the scheduler's actions) ---------------------------------------------


def beat_arguments(parser: argparse.ArgumentParser) -> None:
    # Every other option is passed to `celery beat` as it is (e.g. -s FILE for the schedule file).
    parser.set_defaults(celery_args=[], passthrough=True)


def cmd_beat(args: argparse.Namespace, settings: Settings) -> int:
    """The scheduler: monitor, retention and alerts on the maintenance queue (one schedule fleet-wide)."""
    from cli.services import with_schedule_file
    from scheduler.beat import run_beat

    return run_beat(with_schedule_file(args.celery_args, settings.local.var_dir))


def dry_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="say what would be done, change nothing")


def cmd_reap(args: argparse.Namespace, settings: Settings) -> int:
    """One monitor pass now: resume or fail tasks whose worker died, repair interrupted completions."""
    from scheduler.jobs import format_reap, reap

    for line in format_reap(reap(args.dry_run), dry_run=args.dry_run):
        out(line)
    return 0


def cmd_retention(args: argparse.Namespace, settings: Settings) -> int:
    """Gzip and delete completed contexts by age (contexts.retention)."""
    from scheduler.jobs import format_retention, retention

    for line in format_retention(retention(args.dry_run), dry_run=args.dry_run):
        out(line)
    return 0


def cmd_alerts(args: argparse.Namespace, settings: Settings) -> int:
    """Check disk use, failure rate, running and long-running tasks against the alert thresholds."""
    from scheduler.alerts import alerts, format_alerts

    report = alerts()
    for line in format_alerts(report):
        out(line)
    return 1 if report.alerts else 0  # scripts and cron jobs check the exit code


# -- webhook ---------------------------------------------------------------------------------------


def webhook_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="address to listen on (default: webhook.host)")
    parser.add_argument("--port", type=int, help="port to listen on (default: webhook.port)")


def cmd_webhook(args: argparse.Namespace, settings: Settings) -> int:
    """Serve the HTTP intake (webhooks, task API, /healthz, /metrics) with uvicorn."""
    from webhooks.server import serve

    serve(args.host, args.port)
    return 0


def console_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="address to listen on (default: console.host, 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default: console.port, 8765)")


def cmd_console(args: argparse.Namespace, settings: Settings) -> int:
    """Serve the operators' console alone (contexts; Redis when it answers) with uvicorn."""
    from cli.console_access import console_access
    from console.server import serve

    access = console_access(settings, args.host)
    address = f"http://{args.host or settings.console.host}:{args.port or settings.console.port}/console/"
    out(f"console: {address} ({access.hint}); Ctrl-C stops it")
    serve(access.settings, args.host, args.port)
    return 0


# -- up, demo, replay-model ----------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    """The main job end to end on embedded defaults (SPEC §11)."""
    from cli.demo import run_demo

    return run_demo(settings, out, force_replay=args.model == "replay")


def demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", choices=("auto", "replay"), default="auto",
        help="auto: a configured model if there is one, else the replay model; replay: always the replay model",
    )


def up_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-beat", action="store_true", help="do not start the scheduler")
    parser.add_argument("--no-webhook", action="store_true", help="do not start the HTTP intake")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address the intake (and its console) binds to (default 127.0.0.1: this machine only; "
                             "0.0.0.0 to receive webhooks from elsewhere)")


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    """Worker, beat and webhook intake on one machine; an embedded Redis when none answers."""
    from cli.up import run_up

    return run_up(settings, out, beat=not args.no_beat, webhook=not args.no_webhook, host=args.host)


def replay_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trajectory", type=Path, metavar="FILE", help="a scripted trajectory (JSONL or YAML)")
    source.add_argument("--context", metavar="UUID", help="replay the assistant turns of a recorded context")
    parser.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (default 8000)")


def cmd_replay_model(args: argparse.Namespace, settings: Settings) -> int:
    """Serve the replay model (OpenAI and Ollama APIs) until interrupted."""
    from replay import run_replay_model
    from worker.stores import open_store

    messages = None
    if args.context:
        messages = open_store(settings).locate_inside(args.context) / "messages.jsonl"
    elif not args.trajectory.is_file():
        raise TasukiError(f"no trajectory file at {args.trajectory}")
    run_replay_model(args.trajectory, messages, args.port)
    return 0
