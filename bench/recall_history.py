"""Episodes for the recall benchmark from a repository's real history: ``python -m bench.recall_history GIT_DIR
OUT.jsonl [--count N] [--until REV]`` writes one line per commit (short hash, author date, message, changed paths),
newest first, merges and dependency or CI-bot commits left out (they say nothing a user would ask about).

Reads a bare mirror with ``git --git-dir``; the mirror is data fetched on purpose, not an agent's checkout.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

SKIPPED = re.compile(
    r"^(bump |build\(deps|\[pre-commit\.ci\]|pre-commit autoupdate|update (pinned |dev )?(requirements|dependencies)"
    r"|merge (branch|pull request|remote)|update pre-commit|release version|start version|version \d)",
    re.IGNORECASE,
)
SEPARATOR = "\x1e"


def commits(git_dir: Path, until: str, count: int) -> list[dict[str, object]]:
    """The newest ``count`` kept commits reachable from ``until``, newest first."""
    log = subprocess.run(
        ["git", "--git-dir", str(git_dir), "log", "--no-merges", "--name-only", "--no-renames",
         f"--format={SEPARATOR}%H%x1f%aI%x1f%B%x1f", until],
        capture_output=True, text=True, check=True,
    ).stdout
    kept: list[dict[str, object]] = []
    for entry in log.split(SEPARATOR)[1:]:
        commit, date, message, paths = entry.split("\x1f", 3)
        message = message.strip()
        if not message or SKIPPED.match(message):
            continue
        kept.append({"commit": commit[:10], "date": date, "message": message,
                     "paths": [p for p in paths.strip().splitlines() if p]})
        if len(kept) == count:
            break
    return kept


def main() -> None:
    """Write the history file."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("git_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--count", type=int, default=400)
    parser.add_argument("--until", default="HEAD")
    args = parser.parse_args()
    rows = commits(args.git_dir, args.until, args.count)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{len(rows)} commits, {rows[-1]['date']} to {rows[0]['date']}")


if __name__ == "__main__":
    main()
