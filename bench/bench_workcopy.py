"""A task's git on a large repository: warm working copies and checkpoints with a persistent index.

The repository is built here with ``git fast-import`` (nothing downloaded): 5,000 files in 50 directories and 300
commits of history. Measured in one run, each against a baseline of the same run:

- the second task's checkout (mirror refresh + switching the first task's tree) against the first's (the
  mirror's clone and a whole new tree), and against a plain ``git clone`` per task (what Tasuki did before);
  also the third's: the first tree's files written in the same second as its index are "racily clean" to git
  (1 s timestamps), so the second task hashes them once more; later tasks do not;
- a checkpoint after one file changed: ``git add -A`` with the persistent index against a fresh index
  (``read-tree HEAD`` each time, as before), both followed by the same write-tree.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
from pathlib import Path

from bench.common import Result, standalone, timed
from worker.checkout import Checkout, run_git
from worker.workcopy import GitCache

SECOND_TARGET = 0.1


def build_repository(path: Path, files: int, commits: int) -> Path:
    """A bare repository of ``files`` files and ``commits`` commits (each later one changes 10 files)."""
    run_git(("init", "-q", "--bare", "-b", "main", str(path)), cwd=path.parent)
    lines = []
    when = 1_700_000_000
    for n in range(commits):
        message = f"commit {n}".encode()
        lines.append(f"commit refs/heads/main\nmark :{n + 1}\ncommitter B <b@b> {when + n} +0000\n"
                     f"data {len(message)}\n{message.decode()}\n")
        if n:
            lines.append(f"from :{n}\n")
        changed = range(files) if n == 0 else range(n * 10 % files, n * 10 % files + 10)
        for k in changed:
            blob = f"file {k} at commit {n}\n" + "line of code\n" * (k % 40)
            lines.append(f"M 100644 inline src/d{k % 50}/f{k}.txt\ndata {len(blob.encode())}\n{blob}\n")
    subprocess.run(["git", "fast-import", "--quiet"], cwd=path, input="".join(lines).encode(), check=True)
    return path


def prepared(checkout: Checkout) -> float:
    """Seconds ``checkout.prepare`` takes for a new task."""
    return timed(lambda: checkout.prepare(fresh=True))


def checkout_times(scratch: Path, remote: Path, rounds: int) -> tuple[float, float, float, float]:
    """Seconds of (the first task's checkout, the second's, the third's, a plain clone per task), medians."""
    times: list[list[float]] = [[], [], [], []]
    for r in range(rounds):
        cache = GitCache(scratch / f"cache-{r}", scratch / f"workspaces-{r}")
        for n in range(3):
            task = Checkout(cache.workspaces / f"{n}aaaaaaa-{r}", str(remote), f"tasuki/{n}-{r}", cache=cache)
            times[n].append(prepared(task))
            (task.path / "src" / f"d{n}" / f"f{n}.txt").write_text("changed by the task\n")
            task.release()
        plain = Checkout(scratch / f"plain-{r}" / "cccccccc-3", str(remote), "tasuki/3-cccccccc")
        times[3].append(prepared(plain))
        for path in (cache.root, cache.workspaces, plain.path.parent):
            shutil.rmtree(path)
    print("workcopy    per round (s):", [[round(x, 3) for x in t] for t in times], flush=True)
    first, second, third, clone = (statistics.median(t) for t in times)
    return first, second, third, clone


def snapshot(checkout: Checkout, *, fresh_index: bool) -> float:
    """Seconds of a checkpoint's ``add -A`` + ``write-tree`` (after ``read-tree HEAD`` with ``fresh_index``)."""
    def work() -> None:
        if fresh_index:
            checkout.git("read-tree", "HEAD", index=True)
        checkout.git("add", "-A", index=True)
        checkout.git("write-tree", index=True)
    return timed(work)


def checkpoint_times(scratch: Path, remote: Path, rounds: int) -> tuple[float, float]:
    """Seconds of a checkpoint's snapshot with the persistent index and from a fresh one, medians."""
    checkout = Checkout(scratch / "ws" / "dddddddd-4", str(remote), "tasuki/4-dddddddd")
    checkout.prepare(fresh=True)
    snapshot(checkout, fresh_index=True)  # the persistent index after the first checkpoint
    persistent, fresh = [], []
    for r in range(rounds):
        (checkout.path / "src" / "d2" / "f2.txt").write_text(f"step {r}\n")
        persistent.append(snapshot(checkout, fresh_index=False))
        (checkout.path / "src" / "d3" / "f3.txt").write_text(f"step {r}\n")
        fresh.append(snapshot(checkout, fresh_index=True))
        snapshot(checkout, fresh_index=False)  # stat information back in the index, for the next round
    return statistics.median(persistent), statistics.median(fresh)


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Measure, print one line per comparison, return the results."""
    files, commits, rounds = (500, 30, 1) if quick else (5000, 300, 3)
    scratch.mkdir(parents=True, exist_ok=True)
    remote = build_repository(scratch / "remote.git", files, commits)
    first, second, third, clone = checkout_times(scratch, remote, rounds)
    ratio = second / first
    print(f"workcopy    {files:,} files, {commits} commits: first task's checkout {first * 1000:.0f} ms, second "
          f"{second * 1000:.0f} ms: ratio {ratio:.3f}  target <= {SECOND_TARGET}; third {third * 1000:.0f} ms: "
          f"{third / first:.3f}; a plain clone per task {clone * 1000:.0f} ms", flush=True)
    persistent, fresh = checkpoint_times(scratch, remote, rounds)
    print(f"workcopy    checkpoint after one changed file: persistent index {persistent * 1000:.1f} ms, fresh index "
          f"{fresh * 1000:.1f} ms: ratio {persistent / fresh:.3f}", flush=True)
    return [
        Result("second task's checkout vs first", f"{ratio:.3f}", f"<= {SECOND_TARGET}", ratio <= SECOND_TARGET),
        Result("third task's checkout vs first", f"{third / first:.3f}", "-", None),
        Result("second checkout vs a plain clone", f"{second / clone:.3f}", "-", None),
        Result("checkpoint: kept vs fresh index", f"{persistent / fresh:.3f}", "-", None),
    ]


if __name__ == "__main__":
    standalone(run, __doc__)
