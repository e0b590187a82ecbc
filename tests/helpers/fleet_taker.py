"""A lease taker in a process of its own, for tests that run it under ``faketime``: one ``take`` on the fleet store,
then one JSON line with the epoch it got (null: refused) and the wall clock this process saw.

    python -m tests.helpers.fleet_taker DSN UUID HOLDER LEASE_S
"""

from __future__ import annotations

import json
import sys
import time

import psycopg

from fleet import lease


def main(dsn: str, uuid: str, holder: str, lease_s: str) -> None:
    with psycopg.connect(dsn) as conn:
        epoch = lease.take(conn, uuid, holder, float(lease_s))
    print(json.dumps({"epoch": epoch, "clock": time.time()}))


if __name__ == "__main__":
    main(*sys.argv[1:5])
