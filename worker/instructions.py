"""The owner's instruction files as they are in the commit a task started from (SPEC §13, issue 38 item 4).

They are read through the worker's own git directory of the checkout (``Checkout.git``: never the checkout's
``.git``, which is the agent's), from a commit the agent cannot change: an ``AGENTS.md`` the agent writes or edits
in its checkout is never read as instructions. For a follow-up, whose branch holds an earlier task's commits, the
commit is where that branch left the default branch (``git merge-base``), so an earlier agent's files do not count
either.
"""

from __future__ import annotations

import structlog

from contexts.masking import mask
from memory.instructions import MAX_FILE_BYTES, is_instruction_file
from worker.checkout import Checkout
from worker.gitdirs import GitError

log = structlog.get_logger(__name__)

DEFAULT_BRANCH = "origin/HEAD"  # what a task branch starts from (Checkout._start_point)
MAX_READ_BYTES = 4 * 1024 * 1024  # a larger "instruction file" is not read at all
REGULAR_MODES = ("100644", "100755")  # blobs; a symlink (120000) or a submodule (160000) is no instruction file


class CommitInstructions:
    """The instruction files of the commit whose files count for a task that started from ``base``
    (:func:`instructions_commit`), listed once and read when asked for (masked)."""

    def __init__(self, checkout: Checkout, base: str | None) -> None:
        self.checkout = checkout
        self.base = base
        self.commit: str | None = None  # found with the listing
        self._blobs: dict[str, tuple[str, int]] | None = None  # path -> (object id, size)
        self._texts: dict[str, str | None] = {}

    def names(self) -> frozenset[str]:
        """Paths of the instruction files the commit holds (regular files only)."""
        return frozenset(self._listed())

    def read(self, path: str) -> str | None:
        """The file's text as committed, masked and cut to MAX_FILE_BYTES; None when it is not there or not text."""
        if path not in self._texts:
            self._texts[path] = self._read(path)
        return self._texts[path]

    def _read(self, path: str) -> str | None:
        blob = self._listed().get(path)
        if blob is None or blob[1] > MAX_READ_BYTES:
            return None
        try:
            text = self.checkout.git("cat-file", "blob", blob[0])
        except (GitError, UnicodeDecodeError, OSError) as exc:
            log.warning("instruction file not read", path=path, error=str(exc)[:200])
            return None
        return mask(text[:MAX_FILE_BYTES])

    def _listed(self) -> dict[str, tuple[str, int]]:
        if self._blobs is None:
            self._blobs = {}
            self.commit = instructions_commit(self.checkout, self.base)
            if self.commit is None:
                return self._blobs
            try:
                listing = self.checkout.git("ls-tree", "-r", "-z", "-l", "--full-tree", self.commit)
            except (GitError, UnicodeDecodeError, OSError) as exc:
                log.warning("instruction files not listed", commit=self.commit, error=str(exc)[:200])
                return self._blobs
            for entry in listing.split("\0"):
                meta, _, path = entry.partition("\t")
                fields = meta.split()
                regular = len(fields) == 4 and fields[0] in REGULAR_MODES and fields[1] == "blob"
                if regular and is_instruction_file(path):
                    self._blobs[path] = (fields[2], int(fields[3]))
        return self._blobs


def instructions_commit(checkout: Checkout, base: str | None) -> str | None:
    """The commit whose instruction files count: where the task's start commit ``base`` meets the default branch
    (``base`` itself for a task that starts from the default branch). None: no such commit is known."""
    if not base:
        return None
    try:
        return checkout.git("merge-base", base, DEFAULT_BRANCH).strip() or None
    except GitError as exc:
        log.warning("no commit to read the repository instructions from", base=base, error=str(exc)[:200])
        return None
