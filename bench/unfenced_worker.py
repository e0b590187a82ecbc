"""``python -m bench.unfenced_worker -A worker worker ...``: Celery's command with the owner check turned off
(``agent.fencing.ENFORCED``), the code path from before it: the baseline of ``bench.bench_fencing``. The pool
processes are forked from this one and keep the switch."""

from __future__ import annotations

import sys

from celery.__main__ import main

from agent import fencing

if __name__ == "__main__":
    fencing.ENFORCED = False
    sys.exit(main())
