"""``tasuki eval``: run a task set through the fleet and report on it (issue 39).

- ``tasuki eval run SET --profile NAME [--profile OTHER] [--attempts N] [--limit K] [--repos DIR] [--name RUN]``
  (:mod:`evals.runs`): resumable — the same ``--name`` again continues the run;
- ``tasuki eval report RUN [--json] [--predictions FILE]`` (:mod:`evals.report`, :mod:`evals.predictions`);
- ``tasuki eval list``: the runs under ``local.var_dir``/evals.

(H3 wrote run, report and list; ``tasuki eval mine`` (H2) belongs here too: add its ``cmd_``/``_arguments`` pair
below and its ``Command(("eval", "mine"), ...)`` in :mod:`cli.main`.)
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.common import out, warn

if TYPE_CHECKING:
    from evals.runs import Progress
    from worker.settings_models import Settings


def run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("set", metavar="SET", help="the task set: SWE-bench JSON or JSONL rows")
    parser.add_argument("--profile", action="append", required=True, metavar="NAME",
                        help="a model profile (llm.models) to run every row with; twice to compare two")
    parser.add_argument("--attempts", type=int, default=1, metavar="N", help="attempts per row and profile")
    parser.add_argument("--limit", type=int, metavar="K", help="only the first K rows")
    parser.add_argument("--repos", type=Path, metavar="DIR",
                        help="local clones or mirrors (DIR/owner/name, DIR/owner__name or DIR/name); default: clone "
                             "from the forge")
    parser.add_argument("--name", metavar="RUN", help="the run's name; an existing run's name continues it")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="stop waiting after this long (the tasks go on; the same --name waits for them again)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def _progress_printer(stream: Any = None) -> Any:
    """A progress bar on a terminal (rewritten in place), a line per change otherwise."""
    stream = stream or sys.stderr
    tty = stream.isatty()
    shown = [""]  # the last line written: without a terminal, a line is written only when it changed

    def show(progress: Progress) -> None:
        width = 30
        done = int(width * progress.finished / progress.total) if progress.total else width
        line = (f"[{'#' * done}{'.' * (width - done)}] {progress.finished}/{progress.total} finished · "
                f"{progress.resolved} resolved · {progress.running} running · {progress.queued} queued")
        if not tty and line == shown[0]:
            return
        shown[0] = line
        stream.write(f"\r{line}" if tty else f"{line}\n")
        stream.flush()

    return show


def cmd_eval_run(args: argparse.Namespace, settings: Settings) -> int:
    """Run (or continue) an eval and print its report."""
    from evals.fleet import local_fleet
    from evals.report import build_report, report_lines
    from evals.rundir import EvalError, evals_dir
    from evals.runs import EvalRun, make_plan, open_run
    from evals.tasksets import load_set
    from worker.profiles import check_profile

    if args.attempts < 1 or (args.limit is not None and args.limit < 1):
        raise EvalError("--attempts and --limit must be at least 1")
    profiles = [check_profile(settings, name) for name in args.profile]
    if len(set(profiles)) != len(profiles):
        raise EvalError("each --profile once")
    loaded = load_set(Path(args.set))
    for error in loaded.errors:
        warn(f"{args.set}: line {error.line}{f' ({error.instance_id})' if error.instance_id else ''} skipped: "
             f"{error.reason}")
    rows = list(loaded.rows)[: args.limit] if args.limit else list(loaded.rows)
    if not rows:
        raise EvalError(f"{args.set}: no row to run")
    now = datetime.now(UTC)
    name = args.name or f"{Path(args.set).stem}-{now:%Y%m%d-%H%M%S}"
    run = open_run(settings.local.var_dir, name)
    plan = make_plan(name, str(Path(args.set).absolute()), rows, profiles, args.attempts, now)
    continued = run.start(plan)
    sys.stderr.write(f"eval run {name} ({'continued' if continued else 'new'}; "
                     f"{len(rows) * len(profiles) * args.attempts} tasks; again: --name {name})\n")
    runner = EvalRun(run, rows, profiles, args.attempts, local_fleet(settings), repos_dir=args.repos,
                     cache_dir=evals_dir(settings.local.var_dir) / "repositories")
    pending = runner.execute(args.timeout, _progress_printer())
    sys.stderr.write("\n" if sys.stderr.isatty() else "")
    report = build_report(run.plan(), run.results())
    if args.json:
        out(json.dumps(report, indent=2, sort_keys=True))
    else:
        for line in report_lines(report):
            out(line)
    if pending:
        warn(f"{len(pending)} task(s) not finished yet; `tasuki eval run {args.set} --name {name} ...` waits for "
             "them")
        return 1
    return 0


def report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_name", metavar="RUN", help="the run's name (tasuki eval list)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--predictions", type=Path, metavar="FILE",
                        help="also write the predictions in SWE-bench's format (JSONL) to FILE")


def cmd_eval_report(args: argparse.Namespace, settings: Settings) -> int:
    """The report of a run, from its directory; optionally its predictions."""
    from evals.predictions import write_predictions
    from evals.report import build_report, report_lines
    from evals.runs import open_run

    run = open_run(settings.local.var_dir, args.run_name)
    report = build_report(run.plan(), run.results())
    if args.json:
        out(json.dumps(report, indent=2, sort_keys=True))
    else:
        for line in report_lines(report):
            out(line)
    if args.predictions is not None:
        count = write_predictions(run, args.predictions)
        sys.stderr.write(f"{count} prediction(s) written to {args.predictions}\n")
    return 0


def cmd_eval_list(args: argparse.Namespace, settings: Settings) -> int:
    """Every run, newest first: rows, profiles, finished tasks, resolved per profile."""
    from evals.report import build_report
    from evals.rundir import list_runs

    runs = list_runs(settings.local.var_dir)
    if not runs:
        out("no eval runs")
        return 0
    for run in runs:
        report = build_report(run.plan(), run.results())
        total = report["rows"] * len(report["profiles"]) * report["attempts"]
        rates = ", ".join(f"{profile} {s['resolved']}/{s['tasks']}" for profile, s in report["profiles"].items())
        out(f"{run.name:<40} {report['rows']:>4} rows  {total - report['pending']:>4}/{total} finished  {rates}")
    return 0


def mine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="PATH|OWNER/REPO",
                        help="a local clone or mirror, or a GitHub repository (cloned into a temporary directory)")
    parser.add_argument("--out", type=Path, metavar="FILE", help="write the rows (JSONL) to FILE; default: stdout")
    parser.add_argument("--limit", type=int, metavar="N", help="stop once N rows are kept")
    parser.add_argument("--since", metavar="REV", help="only the changes after REV")
    parser.add_argument("--repo", metavar="OWNER/NAME",
                        help="the rows' repository (default: OWNER/REPO, or the clone's origin remote)")
    parser.add_argument("--setup", metavar="SCRIPT",
                        help="bash that builds the environment (@FILE: read from FILE); each row keeps it; default: "
                             "the repository's declaration")
    parser.add_argument("--test-command", metavar="TEMPLATE",
                        help="runs the test files, {files} replaced by them; default: the parser's")
    parser.add_argument("--parser", default="pytest", help="how the test output is read (pytest, unittest)")
    parser.add_argument("--no-forge", action="store_true",
                        help="problem statements from commit messages only (never ask the forge for the issue)")
    parser.add_argument("--timeout", type=int, default=600, metavar="SECONDS", help="of one test run")
    parser.add_argument("--report", type=Path, metavar="FILE",
                        help="write what was kept and dropped, and why, as JSON to FILE")


def cmd_eval_mine(args: argparse.Namespace, settings: Settings) -> int:
    """Mine a task set from a repository's history; the rows as JSONL, one line per change on stderr."""
    from evals.mine import MineOptions, mine
    from evals.rundir import EvalError
    from evals.tasksets import dump_set
    from sandbox.test_results import PARSERS

    if args.limit is not None and args.limit < 1:
        raise EvalError("--limit must be at least 1")
    if args.parser not in PARSERS:
        raise EvalError(f"--parser {args.parser!r}: known are {', '.join(sorted(PARSERS))}")
    setup = args.setup
    if setup is not None and setup.startswith("@"):
        setup = Path(setup[1:]).read_text(encoding="utf-8")
    options = MineOptions(args.source, repo=args.repo, limit=args.limit, since=args.since, setup=setup,
                          test_command=args.test_command, parser=args.parser, forge=not args.no_forge,
                          timeout_s=args.timeout)

    def said(row: Any, change: Any, why: str | None) -> None:
        what = (f"kept {row.instance_id} ({len(row.FAIL_TO_PASS)} fail to pass, {len(row.PASS_TO_PASS)} pass to pass)"
                if row is not None else f"dropped: {why}")
        sys.stderr.write(f"{change.commit[:12]} {what}\n")
        sys.stderr.flush()

    rows, report = mine(options, settings, said)
    if args.report is not None:
        args.report.write_text(json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if args.out is not None:
        dump_set(rows, args.out)
    else:
        for row in rows:
            out(json.dumps(row.to_json(), sort_keys=True))
    sys.stderr.write(f"{len(rows)} row(s) kept of {report.candidates} change(s) touching tests and code "
                     f"({report.changes} walked){f' -> {args.out}' if args.out else ''}\n")
    if not rows:
        warn("no row kept" + (f"; the forge: {report.forge_error}" if report.forge_error else ""))
        return 1
    return 0
