"""A task's git on a large repository: warm working copies and checkpoints with a persistent index.

The repository is built here with ``git fast-import`` (nothing downloaded): 5,000 files in 50 directories and 300
commits of history. Measured in one run, each against a baseline of the same run:

- the second task's checkout (mirror refresh + switching the first task's tree) against the first's (the
  mirror's clone and a whole new tree), and against a plain ``git clone`` per task (what Tasuki did before);
  also the third's: the first tree's files written in the same second as its index are "racily clean" to git
  (1 s timestamps), so the second task hashes them once more; later tasks do not;
- a checkpoint after one file changed: ``git add -A`` with the persistent index against a fresh index
  (``read-tree HEAD`` each time, as before), both followed by the same write-tree;
- a burst: eight task processes of one host refreshing the repository's mirror at the same moment, after a new
  commit, against one process refreshing it alone; and how many of the eight fetched (a fetch begun after a
  process asked serves it too).
"""

from __future__ import annotations

import multiprocessing
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import Result, standalone, timed
from worker import workcopy
from worker.checkout import Checkout, run_git
from worker.workcopy import GitCache

BURST = 8

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


def new_commit(remote: Path) -> None:
    """One more commit on the remote's ``main`` (its tree unchanged): something for the next fetch to bring."""
    tree = run_git(("rev-parse", "main^{tree}"), cwd=remote).strip()
    commit = run_git(("commit-tree", tree, "-p", "main", "-m", "more"), cwd=remote).strip()
    run_git(("update-ref", "refs/heads/main", commit), cwd=remote)


def burst_refresh(cache: GitCache, remote: Path, processes: int) -> tuple[float, int]:
    """``processes`` forked processes refreshing the mirror at once (after a new commit): the seconds until
    every one has it, and how many ran a fetch."""
    forked = multiprocessing.get_context("fork")
    fetches = forked.Value("i", 0)
    barrier = forked.Barrier(processes + 1)

    def one() -> None:
        real = workcopy.run_git

        def counted(args: tuple[str, ...], **kwargs: Any) -> str:
            if args[0] == "fetch":
                with fetches.get_lock():
                    fetches.value += 1
            return real(args, **kwargs)

        workcopy.run_git = counted  # this child's own module: it counts, then runs git as before
        barrier.wait()
        cache.refresh(str(remote), None)

    new_commit(remote)
    children = [forked.Process(target=one) for _ in range(processes)]
    for child in children:
        child.start()
    barrier.wait()
    started = time.perf_counter()
    for child in children:
        child.join()
    return time.perf_counter() - started, int(fetches.value)


def burst_times(scratch: Path, remote: Path, rounds: int) -> tuple[float, float, int]:
    """Median seconds of one refresh alone and of a burst of ``BURST``, and the fetches of the last burst."""
    cache = GitCache(scratch / "burst-cache", scratch / "burst-workspaces")
    cache.refresh(str(remote), None)  # a warm host: the mirror exists
    alone, burst, fetched = [], [], 0
    for _ in range(rounds):
        new_commit(remote)
        alone.append(timed(lambda: cache.refresh(str(remote), None)))
        seconds, fetched = burst_refresh(cache, remote, BURST)
        burst.append(seconds)
    return statistics.median(alone), statistics.median(burst), fetched


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
    alone, burst, fetched = burst_times(scratch, remote, rounds * 3)
    print(f"workcopy    {BURST} processes refreshing one mirror at once {burst * 1000:.0f} ms, one alone "
          f"{alone * 1000:.0f} ms: ratio {burst / alone:.2f}; {fetched} of the {BURST} fetched", flush=True)
    return [
        Result("second task's checkout vs first", f"{ratio:.3f}", f"<= {SECOND_TARGET}", ratio <= SECOND_TARGET),
        Result("third task's checkout vs first", f"{third / first:.3f}", "-", None),
        Result("second checkout vs a plain clone", f"{second / clone:.3f}", "-", None),
        Result("checkpoint: kept vs fresh index", f"{persistent / fresh:.3f}", "-", None),
        Result(f"{BURST} refreshes of one mirror at once vs one", f"{burst / alone:.2f}", "-", None),
    ]


if __name__ == "__main__":
    standalone(run, __doc__)
