"""Issue 39: ``tasuki eval mine`` on a real repository — rows found, rows kept stable, time per row.

The repository is pallets/itsdangerous: its whole history from the mirror at ``MIRROR`` when this machine has it,
else the fixture bundle's (tests/fixtures/evals: its history up to 3d3dc9f). ``tasuki eval mine`` runs as an operator
runs it (a subprocess, the sandbox, the setup building a virtualenv once from a local package index serving pytest
and freezegun: tests/helpers/mined_fixture.py) with ``--report``. Printed: the changes walked, those touching tests and
code (rows found), those kept with a stable FAIL_TO_PASS, the setup's time, and the miner's time per change against the
bare floor measured in the same run: the same four test runs of each kept row (twice before its code patch, twice
after) on the host, in a plain work tree, with no sandbox and nothing else.

``python -m bench.bench_eval_mine [--quick]`` (quick: the bundle, two rows)
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import Result, standalone
from evals.tasksets import Row, load_set
from tests.helpers.mined_fixture import REPO, SETUP, TEST_COMMAND, clone_bundle, mining_environment, run_tasuki
from tests.helpers.mined_fixture import tasuki_env as mining_env
from tests.helpers.stack import git

MIRROR = Path("/work/.mirror/pallets+itsdangerous/repo")
TIMEOUT_S = 1800.0


def bare_runs(source: Path, row: Row, scratch: Path) -> float:
    """Seconds of the row's four test runs on the host: base + test patch twice, + code patch twice."""
    tree = scratch / f"bare-{row.instance_id}"
    if not tree.exists():
        git(scratch, "clone", "-q", "--shared", "--no-checkout", str(source), str(tree))
    git(tree, "checkout", "-q", "-f", "--detach", row.base_commit)
    git(tree, "clean", "-q", "-ffdx")
    files = [line[6:] for line in row.test_patch.splitlines() if line.startswith("+++ b/")]
    command = [sys.executable, "-m", "pytest", "-rA", "-q", "-p", "no:cacheprovider", *files]
    # The sandbox's virtualenv holds pytest and freezegun alone: none of this one's plugins load on the bare side.
    env = {"PYTHONPATH": "src", "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    started = time.perf_counter()
    subprocess.run(["git", "apply", "-"], cwd=tree, input=row.test_patch, text=True, check=True)
    for _ in range(2):
        subprocess.run(command, cwd=tree, env=env, capture_output=True, check=False)
    subprocess.run(["git", "apply", "-"], cwd=tree, input=row.patch or "", text=True, check=True)
    for _ in range(2):
        subprocess.run(command, cwd=tree, env=env, capture_output=True, check=False)
    return time.perf_counter() - started


def run(scratch: Path, quick: bool = False) -> list[Result]:
    """Mine the repository once; the bare runs of its kept rows after."""
    scratch.mkdir(parents=True, exist_ok=True)
    source = MIRROR if MIRROR.is_dir() and not quick else clone_bundle(scratch / "itsdangerous")
    where = "the mirror's whole history" if source == MIRROR else "the fixture bundle's history"
    limit = ["--limit", "2"] if quick else []
    out, report_path = scratch / "set.jsonl", scratch / "report.json"
    with mining_environment(scratch / "wheels") as served:
        started = time.perf_counter()
        done = run_tasuki(["eval", "mine", str(source), "--repo", REPO, "--no-forge", "--setup", SETUP,
                           "--test-command", TEST_COMMAND, "--out", str(out), "--report", str(report_path), *limit],
                          mining_env(scratch / "home", served), TIMEOUT_S)
        wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"tasuki eval mine failed: {done.stderr[-2000:]}")
    report = json.loads(report_path.read_text())
    rows = load_set(out).rows
    kept, dropped = report["kept"], report["dropped"]
    seconds = [entry["seconds"] for entry in (*kept, *dropped) if entry["seconds"] > 0.5]  # a change whose tests ran
    per_row = statistics.median(entry["seconds"] for entry in kept)
    bare = statistics.median(bare_runs(source, row, scratch) for row in rows)
    setup_s = (report.get("setup") or {}).get("duration_s", 0.0)
    print(f"eval mine of {REPO} ({where}): {report['changes']} changes walked, {report['candidates']} touching tests "
          f"and code, {len(kept)} kept stable, {len(dropped)} dropped; {wall:.1f} s in all, setup {setup_s:.1f} s",
          flush=True)
    print(f"eval mine: {per_row:.2f} s per kept row (median; {statistics.median(seconds):.2f} s per change whose "
          f"tests ran) vs {bare:.2f} s for its four bare test runs on the host: {per_row / bare:.2f}x", flush=True)
    reasons: dict[str, int] = {}
    for entry in dropped:
        reasons[entry["reason"]] = reasons.get(entry["reason"], 0) + 1
    for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
        print(f"  dropped {count}: {reason}", flush=True)
    return [
        Result("eval mine: rows kept / found", f"{len(kept)}/{report['candidates']}", "—", None),
        Result("eval mine: per row / bare runs", f"{per_row / bare:.2f}", "—", None),
    ]


if __name__ == "__main__":
    standalone(run, __doc__)
