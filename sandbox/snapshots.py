"""Environment snapshots (SPEC §17 "Snapshot and restore"): a built environment kept per key on this host.

Layout under the store's root (every directory 0700)::

    <repository slug>/<key>/home/           the setup's home, as it left it (with .tasuki/env and .tasuki/path)
                           /checkout/       the paths the setup created in the checkout (.venv, node_modules...)
                           /manifest.json   written before the directory is renamed into place
                           /last-used       its mtime: the last restore
    .building-<key>-<random>/               a publish under way (renamed into place when complete)
    .locks/<key>.lock                       one build per key per host (filelock, cross-process)
    .locks/<key>.spare.lock                 one spare being made per key per host
    .locks/spares.lock                      held while a maker checks the spares' disk and claims its share
    .spares/<key>/home/, checkout/          the key's spare: a private copy of its snapshot made off any task's path
               /spare.json                  which snapshot it copies (key, created, paths, bytes); its mtime: made
    .spares/.building-<key>-<random>/       a spare being made (renamed to .spares/<key> when complete)
    .spares/.claimed-<key>-<random>/        a spare a restore took (its entries are moved into the task's copy)

A snapshot is complete or absent: :meth:`SnapshotStore.publish` copies into a temporary directory and renames it
into place, so a crash mid-publish leaves only a ``.building-*`` directory that the sweep removes. Copies are
``cp -a --reflink=auto`` (symlinks, modes and times kept, so a virtualenv keeps working; copy-on-write where the
filesystem can).

A spare (docs/environments.md "Spares") makes the next restore a few renames: :meth:`SnapshotStore.make_spare` copies
the snapshot into ``.spares/`` (the worker calls it in the background once a task that published or restored the
snapshot is over), and :meth:`SnapshotStore.restore` first claims it by one rename (one task wins), checks it copies
exactly the snapshot being restored, and moves its entries into place; anything else and it copies as before. All
spares together stay within ``max_spares_bytes`` (their snapshots' apparent sizes): one that would go over is not
made, and the sweep drops the oldest first. A spare on another filesystem than the task's home or checkout is never
claimed (a rename cannot cross filesystems); a move that fails anyway (``EXDEV`` across two mounts of one
filesystem) falls back to the copy.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.metadata
import json
import os
import posixpath
import re
import secrets as token
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import filelock

from contexts.errors import BAD_DATA_ERRORS
from sandbox import layers
from sandbox.snapshot_files import (
    SnapshotError,
    bytes_under,
    copy_entries,
    copy_paths,
    find_secret,
    move_entries,
    write_private,
)
from sandbox.steps import Declaration

MANIFEST = "manifest.json"
LAST_USED = "last-used"
LOCKS = ".locks"
BUILDING = ".building-"
DELETING = ".deleting-"
SPARES = ".spares"
SPARE_FILE = "spare.json"
CLAIMED = ".claimed-"
SPARE_LOCK = ".spare"
SPARES_LOCK = "spares.lock"
IN_USE = ".in-use"  # .locks/<key>.in-use: held shared (flock) by each task whose layers are the snapshot's directories
SPARE_WAIT_S = 120.0  # a restore waits this long for a spare being made before it copies
STALE_BUILD_S = 3600  # a .building-* directory this old whose lock is free was left by a crash
KEY_FORMAT = re.compile(r"^[0-9a-f]{32}$")
DAY_S = 86400
# The toolchains whose versions are part of the worker image, and how each tells its version.
TOOLCHAINS = (
    ("python3", "--version"),
    ("node", "--version"),
    ("go", "version"),
    ("rustc", "--version"),
    ("javac", "-version"),
)
VERSION_TIMEOUT_S = 10.0
_UNREADABLE: tuple[type[Exception], ...] = (*BAD_DATA_ERRORS, OSError)  # a manifest missing, torn or edited


class SnapshotRefused(SnapshotError):
    """The environment is not kept: a secret's value is in one of its files, or it is too large."""


class SnapshotBusy(SnapshotError):
    """Another build of the same key holds its lock (only with a timeout)."""


def environment_key(repository: str, declaration: Declaration, files: Mapping[str, bytes], image: str) -> str:
    """The key of an environment: the repository, the declaration, the key files' content, the worker image."""
    record = {
        # 2: setups run as a root worker's sandbox user (issue 36), whose snapshots hold that user's files; a format-1
        # snapshot of a root worker holds root's, which the agent could not change through a layer: made anew once.
        "format": 2,
        "repository": repository,
        "declaration": declaration.content(),
        "files": {path: hashlib.sha256(content).hexdigest() for path, content in files.items()},
        "image": image,
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:32]


@functools.cache
def worker_image() -> str:
    """Tasuki's version and the versions of the toolchains on this host's PATH; learnt once per process."""
    return describe_image()


def describe_image(path: str | None = None, timeout: float = VERSION_TIMEOUT_S) -> str:
    """``tasuki 0.1.0; python3 Python 3.13.5; node v20.19.2``: the toolchains found on ``path`` (None: PATH)."""
    try:
        parts = [f"tasuki {importlib.metadata.version('tasuki')}"]
    except importlib.metadata.PackageNotFoundError:
        parts = ["tasuki (not installed)"]
    for tool, flag in TOOLCHAINS:
        program = shutil.which(tool, path=path)
        if program is not None:
            parts.append(f"{tool} {_version(program, flag, timeout)}")
    return "; ".join(parts)


def _version(program: str, flag: str, timeout: float) -> str:
    try:
        told = subprocess.run(
            [program, flag], capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return "(no version)"
    lines = [line.strip() for line in (told.stdout + told.stderr).splitlines() if line.strip()]
    return lines[0] if lines else "(no version)"


@dataclass(frozen=True)
class Snapshot:
    """A complete, published environment."""

    key: str
    repository: str
    path: Path
    paths: tuple[str, ...]  # what it holds of the checkout, relative to it
    created: float
    size_bytes: int

    @property
    def home(self) -> Path:
        return self.path / "home"

    @property
    def checkout(self) -> Path:
        return self.path / "checkout"


def repository_slug(repository: str) -> str:
    """A directory name for the repository: readable, and distinct for distinct repositories."""
    readable = re.sub(r"[^A-Za-z0-9_-]+", "+", repository).strip("+")[:60] or "repository"
    return f"{readable}-{hashlib.sha256(repository.encode()).hexdigest()[:8]}"


class SnapshotStore:
    """This host's snapshots under ``root``: build once per key, restore private copies, sweep the unused."""

    def __init__(
        self,
        root: Path,
        *,
        keep_per_repository: int,
        keep_days: int,
        max_bytes: int,
        max_spares_bytes: int | None = None,
    ) -> None:
        self.root = root
        self.keep_per_repository = keep_per_repository
        self.keep_days = keep_days
        self.max_bytes = max_bytes
        self.max_spares_bytes = max_spares_bytes  # None: one spare per kept snapshot, no other bound

    @contextmanager
    def building(self, key: str, *, timeout: float | None = None) -> Iterator[None]:
        """Hold the key's lock: one build per key on this host; others wait (forever unless ``timeout``)."""
        lock = self._lock(key)
        try:
            lock.acquire(timeout=-1 if timeout is None else timeout)
        except filelock.Timeout as exc:
            raise SnapshotBusy(f"environment {key} is being built by another task") from exc
        try:
            yield
        finally:
            lock.release()

    def find(self, key: str) -> Snapshot | None:
        """The complete snapshot of ``key``, or None."""
        _check_key(key)
        if not self.root.is_dir():
            return None
        for repository_dir in sorted(self.root.iterdir()):
            if not repository_dir.name.startswith(".") and (repository_dir / key / MANIFEST).is_file():
                found = _load(repository_dir / key)
                if found is not None:
                    return found
        return None

    def restore(self, snapshot: Snapshot, home: Path, checkout: Path | None, *, now: float | None = None) -> bool:
        """Put a private copy of the snapshot into the task's home and checkout and record its use; whether it was
        the key's spare (moved into place) rather than a copy made now. ``checkout`` None: the home only, copied
        (the checkout already holds the snapshot's paths, unchanged since they were copied)."""
        try:
            _touch(snapshot.path / LAST_USED, now)
        except OSError as exc:
            raise SnapshotError(f"snapshot {snapshot.key} is gone (swept meanwhile?)") from exc
        if checkout is not None and self._use_spare(snapshot, home, checkout):
            return True
        copy_entries(snapshot.home, home)
        if checkout is not None:
            copy_entries(snapshot.checkout, checkout)
        return False

    def lay(self, snapshot: Snapshot, home: Path, checkout: Path, *, now: float | None = None) -> tuple[str, ...]:
        """Restore by layers (``sandbox.layers``): the task's commands see the snapshot's directories of the checkout
        and of the home (but ``.tasuki``) through overlays, nothing of them copied; the home's files and ``.tasuki``,
        and any file it holds of the checkout, are copied. The paths of the checkout layered."""
        try:
            _touch(snapshot.path / LAST_USED, now)
        except OSError as exc:
            raise SnapshotError(f"snapshot {snapshot.key} is gone (swept meanwhile?)") from exc
        layered = layers.lay(home, checkout, snapshot.checkout, snapshot.paths, snapshot.home)
        in_home = set(layers.home_layered(snapshot.home))
        copy_paths(snapshot.home, sorted(set(os.listdir(snapshot.home)) - in_home), home)
        copied = [path for path in snapshot.paths if path not in layered]
        if copied:
            copy_paths(snapshot.checkout, copied, checkout)
        return layered

    def _use_spare(self, snapshot: Snapshot, home: Path, checkout: Path) -> bool:
        """Claim the key's spare (a rename: of two restores, one wins) and move it into place; False when there is
        none, it copies another snapshot (swept and built again), or a move failed (then the copy, made next,
        writes over what was moved: the same files). A spare on another filesystem than ``home`` or ``checkout``
        is left for a task that can move it (never claimed: each rename would fail with EXDEV)."""
        if not _same_filesystem(self.root / SPARES, home, checkout):
            return False
        claimed = self.root / SPARES / f"{CLAIMED}{snapshot.key}-{token.token_hex(4)}"
        try:
            os.rename(self.root / SPARES / snapshot.key, claimed)
        except OSError:
            if not self._spare_made_meanwhile(snapshot.key):
                return False  # none ready, nor being made
            try:
                os.rename(self.root / SPARES / snapshot.key, claimed)
            except OSError:
                return False
        try:
            if _spare_of(claimed) != _identity(snapshot):
                return False
            move_entries(claimed / "home", home)
            move_entries(claimed / "checkout", checkout)
            return True
        except OSError:
            return False
        finally:
            shutil.rmtree(claimed, ignore_errors=True)  # empty directories once it was moved

    def _spare_made_meanwhile(self, key: str) -> bool:
        """Wait (at most SPARE_WAIT_S) for a spare of ``key`` that another thread or process is making: it began
        first, so it is ready sooner than a copy begun now, and two copies at once would slow each other down.
        Whether one was being made and its maker is done."""
        if not self._locked(key, SPARE_LOCK):
            # Nobody is making one now; a maker that finished after the claim was tried left it in place.
            return (self.root / SPARES / key).is_dir()
        lock = self._lock(key, SPARE_LOCK)
        try:
            lock.acquire(timeout=SPARE_WAIT_S)
        except filelock.Timeout:
            return False
        lock.release()
        return True

    def make_spare(self, snapshot: Snapshot) -> bool:
        """Copy ``snapshot`` into its key's spare, unless one of it is ready or another process is making it;
        whether one was made. Built under a temporary name and renamed when complete; SnapshotError when the
        snapshot went meanwhile (nothing is left) or the spare would take all spares over ``max_spares_bytes``."""
        lock = self._lock(snapshot.key, SPARE_LOCK)
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            return False
        try:
            spares = self.root / SPARES
            final = spares / snapshot.key
            if final.exists():
                if _spare_of(final) == _identity(snapshot):
                    return False
                self._delete(final)
            temp = self._reserve_spare(snapshot)
            try:
                copy_entries(snapshot.home, temp / "home", background=True)
                copy_entries(snapshot.checkout, temp / "checkout", background=True)
                os.utime(temp / SPARE_FILE)  # made now: the sweep drops the oldest spares first
                if _load(snapshot.path) != snapshot:
                    raise SnapshotError(f"snapshot {snapshot.key} went while its spare was made")
                os.rename(temp, final)
            except BaseException:
                shutil.rmtree(temp, ignore_errors=True)
                raise
            return True
        finally:
            lock.release()

    def _reserve_spare(self, snapshot: Snapshot) -> Path:
        """The spare's temporary directory, its ``spare.json`` written first so that makers at work count each
        other's share of ``max_spares_bytes`` (checked and reserved under one lock); SnapshotError when over."""
        spares = self.root / SPARES
        self._make_dir(spares)
        with filelock.FileLock(self.root / LOCKS / SPARES_LOCK, mode=0o600):
            if self.max_spares_bytes is not None:
                taken = sum(size for _entry, size in self._spares_taking_disk(making=snapshot.key))
                if taken + snapshot.size_bytes > self.max_spares_bytes:
                    limit = f"environments.max_spares_bytes ({_human(self.max_spares_bytes)})"
                    raise SnapshotError(
                        f"a spare of {_human(snapshot.size_bytes)} beside the {_human(taken)} of spares would go"
                        f" over {limit}: not made"
                    )
            temp = spares / f"{BUILDING}{snapshot.key}-{token.token_hex(4)}"
            temp.mkdir(mode=0o700)
            write_private(temp / SPARE_FILE, json.dumps(_identity(snapshot)).encode())
        return temp

    def _spares_taking_disk(self, making: str | None = None) -> list[tuple[Path, int]]:
        """The spares that count against ``max_spares_bytes`` and the size each records: the ready ones, and those
        being made by a live maker (one whose key's spare lock is held); a dead maker's half is the sweep's.
        ``making``: the key whose spare lock the caller holds (its halves are a dead maker's)."""
        spares = self.root / SPARES
        if not spares.is_dir():
            return []
        found = []
        for entry in sorted(spares.iterdir()):
            if entry.name.startswith(CLAIMED) or entry.name.startswith(DELETING):
                continue  # being moved into a task, or deleted
            if entry.name.startswith(BUILDING) and (
                _building_key(entry.name) == making or not self._locked(_building_key(entry.name), SPARE_LOCK)
            ):
                continue
            identity = _spare_of(entry)
            size = identity.get("bytes") if identity is not None else None
            found.append((entry, size if isinstance(size, int) else bytes_under(entry)))
        return found

    def _locked(self, key: str, kind: str = "") -> bool:
        """Whether some process holds the lock of ``key`` (``kind``: of its spare) now."""
        if not KEY_FORMAT.match(key):
            return False
        lock = self._lock(key, kind)
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            return True
        lock.release()
        return False

    def publish(
        self,
        key: str,
        repository: str,
        home: Path,
        checkout: Path,
        paths: Sequence[str],
        secrets: Sequence[str] | Mapping[str, str],
        now: float,
    ) -> Snapshot:
        """Keep ``home`` and ``paths`` of ``checkout`` as the snapshot of ``key``; SnapshotRefused if not kept.

        ``secrets``: the setup secrets' values, or a mapping of their names to values (the refusal then names
        the variable). Nothing is left behind when it is refused or fails.
        """
        _check_key(key)
        kept = tuple(sorted({path for path in map(_relative, paths) if _present(checkout, path)}))
        size = bytes_under(home) + sum(bytes_under(checkout / path) for path in kept)
        if size > self.max_bytes:
            limit = f"environments.max_snapshot_bytes ({_human(self.max_bytes)})"
            raise SnapshotRefused(f"the environment is {_human(size)}, over {limit}: not kept")
        self._make_dir(self.root)
        temp = self.root / f"{BUILDING}{key}-{token.token_hex(4)}"
        temp.mkdir(mode=0o700)
        try:
            return self._fill_and_place(temp, key, repository, home, checkout, kept, secrets, now, size)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise

    def _fill_and_place(
        self,
        temp: Path,
        key: str,
        repository: str,
        home: Path,
        checkout: Path,
        kept: tuple[str, ...],
        secrets: Sequence[str] | Mapping[str, str],
        now: float,
        size: int,
    ) -> Snapshot:
        (temp / "home").mkdir(mode=0o700)
        (temp / "checkout").mkdir(mode=0o700)
        copy_entries(home, temp / "home")
        copy_paths(checkout, kept, temp / "checkout")
        if isinstance(secrets, Mapping):
            names = {value: name for name, value in secrets.items()}
        else:
            names = dict.fromkeys(secrets, "a setup secret")
        offence = find_secret(temp, names)
        if offence is not None:
            raise SnapshotRefused(f"contains the value of {offence[0]} in {offence[1]}: not kept")
        manifest = {"format": 1, "repository": repository, "paths": list(kept), "created": now, "bytes": size}
        write_private(temp / MANIFEST, json.dumps(manifest, indent=1).encode())
        _touch(temp / LAST_USED, now)
        parent = self.root / repository_slug(repository)
        self._make_dir(parent)
        try:
            os.rename(temp, parent / key)
        except OSError:
            existing = _load(parent / key)  # published meanwhile by a builder that did not hold the lock
            if existing is None:
                raise
            shutil.rmtree(temp, ignore_errors=True)
            return existing
        return Snapshot(key, repository, parent / key, kept, now, size)

    def sweep(self, now: float) -> list[str]:
        """Delete what is not kept; the removed directories, relative to the root.

        Per repository the ``keep_per_repository`` most recently used snapshots are kept, unless unused for more
        than ``keep_days``; a ``.building-*`` directory older than an hour whose key's lock is free is a crash's.
        """
        if not self.root.is_dir():
            return []
        removed: list[str] = []
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith(BUILDING):
                key = _building_key(entry.name)
                if now - entry.lstat().st_mtime > STALE_BUILD_S and self._remove_unlocked(key, entry):
                    removed.append(entry.name)
            elif entry.name.startswith(DELETING):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry.name)
            elif not entry.name.startswith(".") and entry.is_dir():
                removed.extend(f"{entry.name}/{key}" for key in self._sweep_repository(entry, now))
        spares = self._sweep_spares()
        return removed + [f"{SPARES}/{name}" for name in spares + self._sweep_over_cap()]

    def _sweep_over_cap(self) -> list[str]:
        """Ready spares, oldest made first, until all spares are within ``max_spares_bytes`` again (it was lowered,
        or makers raced past it); the removed names."""
        if self.max_spares_bytes is None:
            return []
        counted = self._spares_taking_disk()
        total = sum(size for _entry, size in counted)
        ready = sorted((_made(entry), entry.name, size) for entry, size in counted if KEY_FORMAT.match(entry.name))
        removed = []
        for _when, name, size in ready:
            if total <= self.max_spares_bytes:
                break
            self._delete(self.root / SPARES / name)  # a rename: a restore claiming it meanwhile gets it whole or not
            total -= size
            removed.append(name)
        return removed

    def _sweep_spares(self) -> list[str]:
        """Spares of snapshots no longer kept (or built again), spares half made by a process that is gone, and
        claimed spares a killed restore left."""
        spares = self.root / SPARES
        if not spares.is_dir():
            return []
        removed = []
        for entry in sorted(spares.iterdir()):
            if entry.name.startswith(BUILDING):
                gone = self._remove_unlocked(_building_key(entry.name), entry, SPARE_LOCK)
            elif entry.name.startswith(CLAIMED):
                gone = self._remove_unlocked(entry.name[len(CLAIMED) :].rsplit("-", 1)[0], entry)
            else:
                snapshot = self.find(entry.name) if KEY_FORMAT.match(entry.name) else None
                gone = snapshot is None or _spare_of(entry) != _identity(snapshot)
                if gone:
                    self._delete(entry)  # a rename: a restore claiming it meanwhile keeps it whole, or misses it
            if gone:
                removed.append(entry.name)
        return removed

    def _delete(self, directory: Path) -> None:
        doomed = self.root / f"{DELETING}{directory.name}-{token.token_hex(4)}"
        with suppress(FileNotFoundError):
            os.rename(directory, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    def _sweep_repository(self, directory: Path, now: float) -> list[str]:
        snapshots = [entry for entry in directory.iterdir() if entry.is_dir() and not entry.is_symlink()]
        used = sorted(((_last_used(snapshot), snapshot) for snapshot in snapshots), reverse=True)
        removed = []
        for rank, (last_used, snapshot) in enumerate(used):
            if rank < self.keep_per_repository and now - last_used <= self.keep_days * DAY_S:
                continue
            if KEY_FORMAT.match(snapshot.name) and self._in_use(snapshot.name):
                continue  # a running task's layers are its directories
            if self._remove_unlocked(snapshot.name, snapshot):
                removed.append(snapshot.name)
        if len(removed) == len(used) and not any(directory.iterdir()):
            with suppress(OSError):
                directory.rmdir()
        return removed

    def _remove_unlocked(self, key: str, directory: Path, kind: str = "") -> bool:
        """Remove ``directory`` unless ``key`` is being built (``kind`` SPARE_LOCK: its spare is being made); renamed
        first, so that find never sees half of it."""
        lock = self._lock(key, kind) if KEY_FORMAT.match(key) else None
        try:
            if lock is not None:
                lock.acquire(timeout=0)
        except filelock.Timeout:
            return False
        try:
            doomed = self.root / f"{DELETING}{key}-{token.token_hex(4)}"
            os.rename(directory, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
            return True
        finally:
            if lock is not None:
                lock.release()

    def hold(self, key: str) -> int:
        """Mark the snapshot of ``key`` in use until the returned descriptor is closed (or this process dies): the
        sweep keeps it. Taken by a task restored by layers (its lower layers are the snapshot's directories)."""
        self._lock(key)  # the directories exist
        descriptor = os.open(self.root / LOCKS / f"{key}{IN_USE}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(descriptor, fcntl.LOCK_SH)
        return descriptor

    def _in_use(self, key: str) -> bool:
        """Whether a task holds the snapshot of ``key`` (:meth:`hold`)."""
        try:
            descriptor = os.open(self.root / LOCKS / f"{key}{IN_USE}", os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(descriptor)  # and with it the probe's lock
        return False

    def _lock(self, key: str, kind: str = "") -> filelock.FileLock:
        _check_key(key)
        self._make_dir(self.root)
        self._make_dir(self.root / LOCKS)
        return filelock.FileLock(self.root / LOCKS / f"{key}{kind}.lock", mode=0o600)

    @staticmethod
    def _make_dir(path: Path) -> None:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)


def _check_key(key: str) -> None:
    if not KEY_FORMAT.match(key):
        raise SnapshotError(f"not an environment key: {key!r}")


def _building_key(name: str) -> str:
    """The key in a temporary directory's name, ``.building-<key>-<random>``."""
    return name[len(BUILDING) :].rsplit("-", 1)[0]


def _same_filesystem(*paths: Path) -> bool:
    """Whether the paths (or, for one not made yet, its nearest existing parent) are on one filesystem."""
    devices = set()
    for path in paths:
        existing = path
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        devices.add(existing.stat().st_dev)
    return len(devices) == 1


def _relative(path: str) -> str:
    """A path of the checkout as the setup reported it; one that leaves the checkout is refused."""
    normal = posixpath.normpath(path)
    if posixpath.isabs(normal) or normal in (".", "..") or normal.startswith("../") or normal.split("/")[0] == ".git":
        raise SnapshotError(f"not a path inside the checkout: {path!r}")
    return normal


def _present(checkout: Path, relative: str) -> bool:
    """Whether the path exists (a symlink counts); refused if it passes through a symlink, which the copy would
    follow out of the checkout."""
    parts = relative.split("/")
    for depth in range(1, len(parts)):
        if (checkout.joinpath(*parts[:depth])).is_symlink():
            raise SnapshotError(f"not a path inside the checkout: {relative!r} passes through a symlink")
    return os.path.lexists(checkout / relative)


def _load(directory: Path) -> Snapshot | None:
    """The snapshot in ``directory`` from its manifest; None when it has none or it is damaged."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        return Snapshot(
            key=directory.name,
            repository=str(manifest["repository"]),
            path=directory,
            paths=tuple(str(path) for path in manifest["paths"]),
            created=float(manifest["created"]),
            size_bytes=int(manifest["bytes"]),
        )
    except _UNREADABLE:
        return None


def _identity(snapshot: Snapshot) -> dict[str, object]:
    """What a spare records of the snapshot it copies: a snapshot swept and built again differs in ``created``."""
    return {
        "key": snapshot.key,
        "created": snapshot.created,
        "paths": list(snapshot.paths),
        "bytes": snapshot.size_bytes,
    }


def _spare_of(directory: Path) -> dict[str, object] | None:
    """The identity a spare records; None when it has none or it is damaged."""
    try:
        found = json.loads((directory / SPARE_FILE).read_text())
    except _UNREADABLE:
        return None
    return found if isinstance(found, dict) else None


def _made(spare: Path) -> float:
    """When the spare was made (its ``spare.json`` touched as it was completed); 0 when it has none."""
    try:
        return (spare / SPARE_FILE).stat().st_mtime
    except OSError:
        return 0.0


def _last_used(directory: Path) -> float:
    """When the snapshot was last restored (or published); a directory without a record counts as never used."""
    try:
        return (directory / LAST_USED).stat().st_mtime
    except OSError:
        return 0.0


def _touch(path: Path, now: float | None) -> None:
    path.touch(mode=0o600)
    if now is not None:
        os.utime(path, (now, now))


def _human(size: int) -> str:
    return f"{size / 1024**3:.1f} GiB" if size >= 1024**3 else f"{size / 1024**2:.1f} MiB"
