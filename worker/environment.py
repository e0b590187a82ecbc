"""A task's repository environment (SPEC §17): declared, then restored from a snapshot or built, before the first
model call; recorded in the context (a ``setup`` record in ``tools.jsonl``, ``state.json.environment``).

A setup that fails, times out, or a declaration that cannot be read never fails the task: the agent is told in its
first message and installs what it needs itself. The key is recorded before anything is built, so a resumed task
restores (or rebuilds) the environment it began with, whatever the agent changed in the lockfiles since.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog

from contexts import Context
from contexts.masking import mask
from sandbox import homefiles, layers
from sandbox.declarations import Declaration, DeclarationError, find_declaration, key_files
from sandbox.egress import EgressError, Refusal, egress_policy, egress_proxy
from sandbox.jail import Bubblewrap, Sandbox, SandboxUnavailable, backend, make_sandbox
from sandbox.setup import SetupOutcome, run_setup, untracked
from sandbox.snapshot_files import SnapshotError
from sandbox.snapshots import Snapshot, SnapshotRefused, SnapshotStore, environment_key, worker_image
from sandbox.toolchain_versions import shortfalls
from sandbox.toolchains import worker_path
from worker.checkout import Checkout, GitError
from worker.settings_models import Settings
from worker.warm_environment import forget, recalled, remember

log = structlog.get_logger(__name__)

TOOL_NAME = "setup"  # its record in tools.jsonl
MARKER = ".tasuki/environment"  # in the task's home: the key of the environment it holds, once it is whole
MAX_PATHS_IN_STATE = 50
SWEEP_EVERY_S = 3600  # how often a host sweeps its snapshots (the processes share a stamp file, as warm copies do)
SWEPT_STAMP = ".swept"  # under the snapshots' root: its mtime is the host's last sweep
MAX_REASON_CHARS = 600  # a snapshot's "not kept" reason in the record (a copy's error names two long paths)
FULL_DISK_BYTES = 16 * 1024 * 1024  # a failed setup that left less free than this on its disk filled it


@dataclass(frozen=True)
class EnvironmentReport:
    """How the task got its environment; ``outcome`` is built, restored, reused (the warm copy's, unchanged since
    its previous task restored it), kept (a resume on this host), failed or none (nothing declared)."""

    outcome: str
    source: str | None = None
    key: str | None = None
    duration_s: float = 0.0
    exit_code: int | None = None
    timed_out: bool = False
    log_tail: str = ""
    created: tuple[str, ...] = ()
    snapshot: str = ""  # why no snapshot was kept or used, when none was ("" otherwise)
    error: str | None = None  # the declaration's error, when it could not be read
    note: str = ""  # what was done about a failure ("What it made was removed: it filled the disk.")
    spare: bool = False  # restored: the key's spare was moved into place (nothing copied on the task's path)
    layers: bool = False  # restored by layers: the snapshot's directories seen through overlays (nothing copied)
    toolchains: tuple[str, ...] = ()  # the versions the repository asks for that the worker's toolchains fall short of

    @property
    def line(self) -> str:
        """The progress comment's words: "restored in 1.8 s", "built in 94 s", "setup failed: ..."."""
        if self.outcome in ("built", "restored", "reused", "kept"):
            verb = "kept from the previous attempt" if self.outcome == "kept" else self.outcome
            return f"{verb} in {_seconds(self.duration_s)}" if self.outcome != "kept" else verb
        if self.outcome == "failed":
            return f"setup failed: {self.why_failed}"
        return "none declared"

    @property
    def why_failed(self) -> str:
        """One line: the declaration's error, the timeout, or the exit code."""
        if self.error is not None:
            return self.error
        if self.timed_out:
            return f"timed out after {_seconds(self.duration_s)}"
        return f"exit code {self.exit_code} after {_seconds(self.duration_s)}"

    def first_message(self) -> str:
        """What the agent's first message says about its environment ("" when all went well)."""
        short = "".join(f"\nNote: {line}" for line in self.toolchains).strip()
        if self.outcome != "failed":
            return short
        return "\n".join(part for part in (self._failure_message(), short) if part)

    def _failure_message(self) -> str:
        if self.error is not None:
            return f"Note: the repository's environment was not set up ({self.error}). Install what you need yourself."
        return (
            f"Note: the repository's environment setup (declared by {self.source}) failed: {self.why_failed}. "
            f"{self.note + ' ' if self.note else ''}"
            "The task goes on without it: install what you need yourself. The last lines of its log:\n"
            f"<setup-log>\n{self.log_tail}\n</setup-log>"
        )

    def state(self) -> dict[str, Any]:
        """What ``state.json.environment`` keeps (no log: it is in the ``setup`` record)."""
        return {
            "outcome": self.outcome,
            "source": self.source,
            "key": self.key,
            "duration_s": round(self.duration_s, 1),
            "exit_code": self.exit_code,
            "line": self.line,
            "created": list(self.created[:MAX_PATHS_IN_STATE]),
            "snapshot": self.snapshot,  # why none was kept or used ("" otherwise): the CLI shows it
            "toolchains": list(self.toolchains),
        }


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"


@dataclass
class TaskEnvironment:
    """Sets up one task's environment in its checkout and home."""

    settings: Settings
    repository: str  # "owner/repo", or the local path of a local task
    clock: Callable[[], float] = time.time
    on_report: Callable[[EnvironmentReport], None] = field(default=lambda report: None)  # metrics
    setup: str | None = None  # an eval task's setup script: it takes the place of the repository's declaration
    # Left for the end of the task (:meth:`after_task`), where it no longer slows the task's own commands: the spare
    # to make (a restore used it, or a restore or a publish found none), and the paths a changed environment was
    # moved out into, to delete.
    spare_due: tuple[SnapshotStore, Snapshot] | None = field(default=None, init=False)
    discarded: list[Path] = field(default_factory=list, init=False)
    held: int | None = field(default=None, init=False)  # restored by layers: the snapshot held until the task's end

    def prepare(self, ctx: Context, checkout: Checkout) -> EnvironmentReport:
        """Find the declaration, then keep, restore or build the environment; record and return how it went.

        The ``setup`` record is written when something was declared (tools.jsonl holds what ran); ``state.json``
        says how it went in every case."""
        started = time.monotonic()
        try:
            report = self._prepare(ctx, checkout, started)
        except (OSError, SnapshotError, SandboxUnavailable, EgressError) as exc:  # the store or the sandbox could not
            # be used (a full disk, no socat for the setup's allow-list): the task goes on without its environment
            self._drop_warm(checkout)
            log.warning("environment not prepared", error=mask(str(exc))[:300])
            why = mask(f"the environment could not be prepared ({type(exc).__name__}: {exc})".splitlines()[0])[:300]
            report = EnvironmentReport("failed", duration_s=time.monotonic() - started, error=why)
        report = _with(report, toolchains=toolchain_shortfalls(checkout.path))
        if report.outcome != "none":
            ctx.append_tool(
                TOOL_NAME,
                {"source": report.source, "key": report.key},
                "error" if report.outcome == "failed" else "success",
                int(report.duration_s * 1000),
                result={**asdict(report), "created": list(report.created), "line": report.line},
                error=report.why_failed if report.outcome == "failed" else None,
            )
        ctx.update_state(environment=report.state())
        log.info("environment " + report.outcome, line=report.line, key=report.key, spare=report.spare)
        self.on_report(report)
        return report

    def _prepare(self, ctx: Context, checkout: Checkout, started: float) -> EnvironmentReport:
        environments = self.settings.environments
        try:
            declaration = find_declaration(checkout.path, self.repository, environments, self.setup)
            files = key_files(checkout.path, environments) if declaration is not None else {}
        except DeclarationError as exc:  # a repository's file, or an operator's key_files glob, that cannot be read
            log.warning("environment declaration not read", error=str(exc))
            self._drop_warm(checkout)
            return EnvironmentReport("failed", error=mask(str(exc)), duration_s=time.monotonic() - started)
        if declaration is None:
            log.info("environment declared by none")
            self._drop_warm(checkout)
            return EnvironmentReport("none", duration_s=time.monotonic() - started)
        log.info("environment declared by " + declaration.source, notes=list(declaration.notes))
        return self._provide(ctx, checkout, declaration, files, started)

    def _provide(
        self, ctx: Context, checkout: Checkout, declaration: Declaration, files: dict[str, bytes], started: float
    ) -> EnvironmentReport:
        """Keep, restore or build the environment of ``declaration``."""
        recorded = ctx.read_state().get("environment") or {}
        current = environment_key(self.repository, declaration, files, worker_image())
        key = str(recorded.get("key") or current)  # a resume keeps the key its task began with
        if not recorded.get("key"):
            ctx.update_state(environment={"key": key, "source": declaration.source, "outcome": "building"})
        if self._kept(checkout, recorded, key):
            created = tuple(str(path) for path in recorded.get("created") or ())
            report = EnvironmentReport("kept", declaration.source, key, time.monotonic() - started, 0, created=created)
            layered = bool(layers.layers_of(checkout.home))
            if layered:
                self._hold(self.store(), key)
            return self._done(checkout, _with(report, layers=layered))
        layers.drop(checkout.home)  # an earlier attempt's layers: never under a build, nor a restore's copy
        reused = self._reuse(checkout, declaration, key, started)
        if reused is not None:
            return reused
        self._drop_warm(checkout)  # another key's, or changed: deleted before anything is restored or built
        # A resume here whose environment is not whole keeps what its agent installed in the home, and builds over
        # it; such a build is not kept as the key's snapshot (it holds more than the setup made).
        clean = not any(checkout.home.iterdir())
        if not backend(self.settings.sandbox.backend).confines:
            log.info("environment snapshots need sandbox.backend: bubblewrap; the setup runs for every task")
            report = self._build(declaration, checkout, key, started, keep=False)
            return _with(report, snapshot="not kept: snapshots need sandbox.backend: bubblewrap")
        store = self.store()
        with store.building(key):
            snapshot = store.find(key)
            if snapshot is not None:
                before = untracked(checkout.path)
                layered = self._layered(checkout)
                try:
                    if layered:
                        store.lay(snapshot, checkout.home, checkout.path, now=self.clock())
                        self._hold(store, key)
                        spare = False
                    else:
                        spare = store.restore(snapshot, checkout.home, checkout.path, now=self.clock())
                except (OSError, SnapshotError) as exc:
                    log.warning("environment snapshot not restored; building it", error=str(exc)[:300])
                    _remove(checkout.path, untracked(checkout.path) - before)  # half a restore
                    _empty(checkout.home)
                else:
                    report = EnvironmentReport("restored", declaration.source, key, time.monotonic() - started, 0)
                    if layered:  # nothing of the checkout's directories copied: the next task lays them again
                        created = tuple(f"{p}/" if (snapshot.checkout / p).is_dir() else p for p in snapshot.paths)
                        return self._done(checkout, _with(report, created=created, layers=True))
                    created = tuple(sorted(_restored(untracked(checkout.path), before, snapshot.paths)))
                    self.spare_due = (store, snapshot)  # the spare it used, or one a killed worker never made
                    return self._done(checkout, _with(report, created=created, spare=spare), snapshot)
            return self._build(declaration, checkout, key, started, keep=key == current and clean, store=store)

    def _build(
        self,
        declaration: Declaration,
        checkout: Checkout,
        key: str,
        started: float,
        *,
        keep: bool,
        store: SnapshotStore | None = None,
    ) -> EnvironmentReport:
        secrets = self.secrets()
        sandbox = self.settings.sandbox
        network = self.settings.environments.setup_network
        policy = egress_policy(network, sandbox.allowed_hosts, sandbox.allowed_internal)
        # The setup's own egress proxy, its only way out (the agent's comes later, with its own).
        with egress_proxy(policy if backend(sandbox.backend).confines else None, _refused) as egress:
            outcome: SetupOutcome = run_setup(
                declaration,
                checkout.path,
                checkout.home,
                self.sandbox(checkout).with_egress(egress),
                timeout_s=self.settings.environments.setup_timeout_s,
                secrets=secrets,
                limits=sandbox.limits,
            )
        report = EnvironmentReport(
            "built" if outcome.succeeded else "failed",
            declaration.source,
            key,
            time.monotonic() - started,
            outcome.exit_code,
            outcome.timed_out,
            outcome.log_tail,
            outcome.created,
        )
        if not outcome.succeeded:
            if _disk_full(checkout.path) or _disk_full(checkout.home):  # it filled the disk: the task could not
                # even commit; what it made goes, so that the agent starts with room
                _remove(checkout.path, set(outcome.created))
                _empty(checkout.home)
                note = "What it made was removed: it filled the disk."
                log.warning("environment setup filled the disk; what it made was removed", created=len(outcome.created))
                return _with(report, created=(), note=note)
            checkout.exclude(outcome.created)  # what it did make is still never committed
            return report
        published: Snapshot | None = None
        if store is not None and keep:
            try:
                published = store.publish(
                    key, self.repository, checkout.home, checkout.path, outcome.created, secrets, now=self.clock()
                )
                if self._spares_wanted(checkout):
                    self.spare_due = (store, published)
            except SnapshotRefused as exc:
                log.warning("environment snapshot not kept", reason=mask(str(exc)))
                report = _with(report, snapshot=mask(str(exc)))
            except (OSError, SnapshotError) as exc:  # the store's disk is full, or unwritable: the task has its
                # environment all the same; publish removed its temporary directory
                why = mask(f"not kept: {exc}".splitlines()[0])[:MAX_REASON_CHARS]
                log.warning("environment snapshot not kept", reason=why)
                report = _with(report, snapshot=why)
        elif store is not None:
            why = "not kept: a resumed task's environment (its declaration or lockfiles changed, or its home was kept)"
            log.info("environment snapshot " + why)
            report = _with(report, snapshot=why)
        return self._done(checkout, report, published)

    def _done(
        self, checkout: Checkout, report: EnvironmentReport, snapshot: Snapshot | None = None
    ) -> EnvironmentReport:
        """The environment is in place: never committed, marked in the home; ``snapshot``: the checkout's paths are
        a copy of it, made just now, recorded for the next task on this warm copy (reused while unchanged)."""
        checkout.exclude(report.created)
        homefiles.write(checkout.home, MARKER, f"{report.key}\n".encode())  # the home is the agent's: no link followed
        record = checkout.environment_record
        if snapshot is not None and record is not None:
            remember(record, checkout.path, snapshot.key, snapshot.created, snapshot.paths)
        return report

    def _reuse(
        self, checkout: Checkout, declaration: Declaration, key: str, started: float
    ) -> EnvironmentReport | None:
        """The environment the warm copy's previous task left, when it is ``key``'s snapshot and every file of it is
        unchanged since it was copied: only the home is restored. None otherwise."""
        record = checkout.environment_record
        warm = recalled(record) if record is not None else None
        if warm is None or warm.key != key or not backend(self.settings.sandbox.backend).confines:
            return None
        store = self.store()
        with store.building(key):  # the sweep deletes a snapshot under this lock: not while its home is copied
            snapshot = store.find(key)
            if snapshot is None or (snapshot.created, snapshot.paths) != (warm.published, warm.paths):
                log.info("environment of the warm copy not reused: its snapshot is gone or was built again")
                return None
            if not warm.unchanged(checkout.path):
                log.info("environment of the warm copy not reused: its previous task changed it")
                return None
            try:
                store.restore(snapshot, checkout.home, None, now=self.clock())
            except (OSError, SnapshotError) as exc:
                log.warning("environment home not restored; restoring it all", error=str(exc)[:300])
                _empty(checkout.home)
                return None
        created = tuple(f"{path}/" if (checkout.path / path).is_dir() else path for path in warm.paths)
        report = EnvironmentReport("reused", declaration.source, key, time.monotonic() - started, 0, created=created)
        return self._done(checkout, report)

    def after_task(self) -> None:
        """In one background thread, make the spare this task's restore or publish left due, then delete what its
        warm copy's previous environment was moved out into: called by the worker once the task is over, whichever
        way it ended (docs/environments.md "Spares"). A worker killed before leaves no spare (the next restore copies,
        and its own task's end makes one) and the discarded paths to the hourly eviction."""
        due, self.spare_due = self.spare_due, None
        discarded, self.discarded = self.discarded, []
        self._hold(None, None)
        if due is not None or discarded:
            threading.Thread(
                target=_after_task, args=(due, discarded), name="environment-after-task", daemon=True
            ).start()

    def _hold(self, store: SnapshotStore | None, key: str | None) -> None:
        """Hold the snapshot of ``key`` for the rest of the task (the sweep keeps it), letting go of any held before;
        None: let go."""
        if self.held is not None:
            os.close(self.held)
            self.held = None
        if store is not None and key is not None:
            self.held = store.hold(key)

    def _drop_warm(self, checkout: Checkout) -> None:
        """Take what the warm copy's previous task left of its environment out of the checkout (not this task's to
        use; deleted after the task); its record goes first, so that a worker killed meanwhile leaves paths the next
        switch's clean deletes."""
        record = checkout.environment_record
        warm = recalled(record) if record is not None else None
        if record is None or warm is None:
            return
        forget(record)
        try:
            aside = checkout.clean(warm.paths)
        except GitError as exc:  # git could not: the paths go all the same (none of them is tracked, as a rule)
            log.warning("warm copy's environment not cleaned by git; deleting it", error=str(exc)[:300])
            _remove(checkout.path, set(warm.paths))
        else:
            if aside is not None:
                self.discarded.append(aside)

    @staticmethod
    def _kept(checkout: Checkout, recorded: dict[str, Any], key: str) -> bool:
        """A resume on this host whose home and checkout still hold the environment of ``key``, whole (restored by
        layers: their snapshot still there)."""
        try:
            marked = (homefiles.read(checkout.home, MARKER, 256) or b"").decode(errors="replace").strip()
        except OSError:  # homefiles.Unreadable too: a link or a pipe the agent left there is no environment
            return False
        paths = recorded.get("created") or ()
        return marked == key and all((checkout.path / str(p)).exists() for p in paths) and layers.whole(checkout.home)

    def _layered(self, checkout: Checkout) -> bool:
        """Whether this task restores by layers (``environments.restore``; auto: where the host's probe passes).
        SnapshotError when they are asked for and cannot be used here."""
        wanted = self.settings.environments.restore
        if wanted == "copy":
            return False
        sandbox = make_sandbox(self.settings.sandbox, read_only=checkout.shared_paths)
        why = (
            layers_unavailable(checkout.path.parent, sandbox)
            if isinstance(sandbox, Bubblewrap)
            else "they need sandbox.backend: bubblewrap"
        )
        if why is not None and wanted == "layers":
            raise SnapshotError(f"environments.restore is layers, but layers cannot be used here: {why}")
        return why is None

    def _spares_wanted(self, checkout: Checkout) -> bool:
        """Whether the next restores copy, so that a spare makes the next one renames (never with layers, nor when
        layers are asked for and cannot be used: those restores fail)."""
        try:
            return not self._layered(checkout)
        except SnapshotError:
            return False

    def store(self) -> SnapshotStore:
        """This host's snapshots."""
        return snapshot_store(self.settings)

    def sandbox(self, checkout: Checkout) -> Sandbox:
        """The task's sandbox with the setup's network."""
        network = self.settings.environments.setup_network
        return make_sandbox(
            self.settings.sandbox.model_copy(update={"network": network}), read_only=checkout.shared_paths
        )

    def secrets(self) -> dict[str, str]:
        """The worker's variables named in ``environments.setup_secrets`` (for the setup's commands only)."""
        found = {}
        for name in self.settings.environments.setup_secrets:
            value = os.environ.get(name)
            if value is None:
                log.warning("setup secret not in the worker's environment", variable=name)
            else:
                found[name] = value
        return found


_layers_probed: dict[Path, str | None] = {}  # workspaces directory -> why layers cannot be used there (None: they can)


def layers_unavailable(workspaces: Path, sandbox: Bubblewrap) -> str | None:
    """Why restores cannot be by layers in ``workspaces`` (None: they can): :func:`sandbox.layers.layers_probe`, once
    per directory and process (the worker's start probes it), and the worker's one line saying which it is."""
    workspaces = workspaces.resolve()
    if workspaces not in _layers_probed:
        why = layers.layers_probe(workspaces, sandbox.command)
        if why is None:
            log.info("environments are restored by layers", workspaces=str(workspaces))
        else:
            log.warning("environments are restored by copy: layers cannot be used here", reason=why[:300])
        _layers_probed[workspaces] = why
    return _layers_probed[workspaces]


def snapshot_store(settings: Settings) -> SnapshotStore:
    """This host's snapshots: ``environments.snapshots_dir``, else ``environments/`` beside the git cache."""
    environments = settings.environments
    root = environments.snapshots_dir or Path(settings.contexts.git_cache_dir).absolute().parent / "environments"
    return SnapshotStore(
        Path(root).absolute(),
        keep_per_repository=environments.keep_per_repository,
        keep_days=environments.keep_days,
        max_bytes=environments.max_snapshot_bytes,
        max_spares_bytes=environments.max_spares_bytes,
    )


def _after_task(due: tuple[SnapshotStore, Snapshot] | None, discarded: list[Path]) -> None:
    """Make the key's spare (the next restore moves it into place instead of copying on its task's path; a next task
    that comes meanwhile waits for it), then delete the discarded paths (nobody waits for that)."""
    if due is not None:
        store, snapshot = due
        try:
            store.make_spare(snapshot)
        except (OSError, SnapshotError) as exc:  # the disk is full, or the snapshot was swept meanwhile: no spare
            log.info("environment spare not made", key=snapshot.key, error=str(exc)[:300])
    for directory in discarded:
        shutil.rmtree(directory, ignore_errors=True)


def maybe_sweep(settings: Settings, now: float) -> list[str]:
    """:meth:`SnapshotStore.sweep` of this host's snapshots, at most once per ``SWEEP_EVERY_S``; what it removed."""
    store = snapshot_store(settings)
    stamp = store.root / SWEPT_STAMP
    try:
        if now - stamp.stat().st_mtime < SWEEP_EVERY_S:
            return []
    except FileNotFoundError:
        if not store.root.is_dir():
            return []  # no snapshot was ever kept here
    stamp.touch(mode=0o600)  # first: the other processes skip this round
    os.utime(stamp, (now, now))
    removed = store.sweep(now)
    if removed:
        log.info("environment snapshots swept", removed=removed)
    return removed


def _restored(after: set[str], before: set[str], paths: tuple[str, ...]) -> set[str]:
    """What a restore made, as git lists it: what is new since it began, and what holds the snapshot's paths
    (a restore cut short by a killed worker left some of them before this one began)."""
    held = {path.rstrip("/") for path in paths}
    return {
        entry
        for entry in after
        if entry not in before
        or any(p == entry.rstrip("/") or (entry.endswith("/") and p.startswith(entry)) for p in held)
    }


def toolchain_shortfalls(checkout: Path) -> tuple[str, ...]:
    """What the repository asks of the worker's toolchains that they fall short of (sandbox/toolchain_versions.py)."""
    try:
        found = tuple(shortfalls(checkout, worker_path()))
    except OSError as exc:  # the checkout is gone: nothing to tell
        log.info("toolchain versions not checked", error=mask(str(exc))[:300])
        return ()
    for line in found:
        log.warning("toolchain too old for the repository", line=line)
    return found


def _with(report: EnvironmentReport, **changes: Any) -> EnvironmentReport:
    return EnvironmentReport(**{**asdict(report), **changes})


def _refused(refusal: Refusal) -> None:
    log.warning("setup egress refused", host=refusal.host, port=refusal.port, reason=refusal.reason)


def _remove(checkout: Path, paths: set[str]) -> None:
    """Delete ``paths`` of the checkout (what a failed restore left)."""
    for path in paths:
        target = checkout / path.rstrip("/")
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)


def _disk_full(path: Path) -> bool:
    """Whether the filesystem of ``path`` has (almost) no room left."""
    try:
        return shutil.disk_usage(path).free < FULL_DISK_BYTES
    except OSError:
        return False


def _empty(home: Path) -> None:
    """Start from an empty home: what a failed or different build left must not mix with what comes next."""
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(mode=0o700, parents=True, exist_ok=True)


def repository_of(task_key: dict[str, str], repo_path: str | None,
                  environment: Mapping[str, Any] | None = None) -> str:
    """The repository an environment belongs to: the one an eval task's ``environment`` names (its rows share one
    environment, though each has a bare remote of its own), else a local task's resolved real path (two spellings of
    one repository are one environment), else ``owner/repo``."""
    if environment and environment.get("repository"):
        return str(environment["repository"])
    if repo_path:
        return str(Path(repo_path).resolve())
    return f"{task_key.get('owner')}/{task_key.get('repo')}"
