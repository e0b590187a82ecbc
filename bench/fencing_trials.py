"""Loop the SIGSTOP trials of issue 26 §1 many times: ``python -m bench.fencing_trials [--trials N] [--seed S]``.

Each trial (tests/helpers/fencing_trial.py) starts a worker on a host of its own, stops its whole process tree at a
point chosen at random — inside the bash call of a random step (continued once the task is done, or while the new
holder is inside the next step), or at the finish boundary — in a random layout (workspaces shared by the workers
as in the compose stack, or one per host), lets a worker on another host take the task over past the stale time,
continues the stopped one, and checks that nothing it did afterwards reached the remote, the forge or the context:
one pull request, its head the commit ``state.json`` records. Prints how many trials held, by point and layout.
Real workers, Redis (a private one), the fake forge, the replay model, git; about 30 s a trial. Needs root.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import traceback
from collections import Counter
from pathlib import Path

from bench.worker_stack import private_redis
from tests.helpers.fencing_trial import LAYOUTS, POINTS, can_set_hostnames, run_trial, trial_stack

STEPS = 4


def main(argv: list[str] | None = None) -> int:
    """Run the trials; exit 1 if any did not hold."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None, help="for a run that chooses the same points again")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: the system's)")
    args = parser.parse_args(argv)
    if not can_set_hostnames():
        print("fencing trials need hostnames of their own for the workers (unshare --uts): run as root")
        return 2
    rng = random.Random(args.seed)
    held: Counter[tuple[str, str]] = Counter()
    broken: Counter[tuple[str, str]] = Counter()
    with tempfile.TemporaryDirectory(prefix="tasuki-fencing-", dir=args.dir) as scratch:
        for n in range(args.trials):
            layout, point = rng.choice(LAYOUTS), rng.choice(POINTS)
            step = rng.randrange(STEPS - 1) if point != "finish" else 0  # bash-mid needs a step after it
            root = Path(scratch) / str(n)
            root.mkdir()
            try:
                with private_redis(root / "redis") as url, trial_stack(root, url, layout, point, step, STEPS) as trial:
                    run_trial(trial)
                held[layout, point] += 1
                print(f"trial {n + 1}: {point} at step {step}, {layout}: held", flush=True)
            except Exception:
                broken[layout, point] += 1
                print(f"trial {n + 1}: {point} at step {step}, {layout}: DID NOT HOLD", flush=True)
                traceback.print_exc(limit=3)
    total = sum(held.values())
    print(f"\nfencing trials: {total} of {args.trials} held")
    for layout in LAYOUTS:
        for point in POINTS:
            if held[layout, point] or broken[layout, point]:
                print(f"  {point:<8} {layout:<8} {held[layout, point]} held, {broken[layout, point]} not")
    return 0 if not broken else 1


if __name__ == "__main__":
    sys.exit(main())
