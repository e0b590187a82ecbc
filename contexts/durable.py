"""The seam between a context and its durable copy beside the host's directory (SPEC §12).

One host keeps nothing beside the directory: :data:`ONE_HOST` does nothing and costs nothing. Many hosts keep every
context in a store that each host reaches (``fleet/``, PostgreSQL), behind these Protocols: the store takes the
task's lease when it creates or opens a context, the context hands every appended line and every state change to
its :class:`DurableWriter`, and the step's :meth:`~DurableWriter.commit` lands them all or none, and only while
this holder's lease is current. ``contexts/`` names no store and imports no driver: the worker picks one by the
``fleet.store`` URL's scheme (worker/stores.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from contexts.errors import ContextNotFoundError


class DurableWriter(Protocol):
    """One holder's writes to one context's durable copy, under the lease epoch it took."""

    epoch: int
    """The lease's fencing token this holder writes under (0: no lease, one host)."""

    cancel_requested: bool
    """A cancel request the durable copy held at this holder's take or its last state commit: someone else's
    (:meth:`DurableCopy.amend`, ``tasuki cancel`` on any host), which the holder's commits keep (one host: False)."""

    def check(self) -> None:
        """Raise :class:`~contexts.errors.FencedError` once this holder knows it lost the lease (no I/O)."""

    def renew(self) -> None:
        """The heartbeat: extend the lease; :class:`~contexts.errors.FencedError` when another epoch holds it."""

    def record(self, file: str, record_id: int, line: str) -> None:
        """Stage one line just appended to ``file`` (its ``seq``/``summary_id`` and its text) for the next commit."""

    def commit(self, state: Mapping[str, Any] | None) -> None:
        """The step's commit point: the staged lines, and ``state`` when given, all or none, only while the epoch is
        current; :class:`~contexts.errors.FencedError` (nothing written) otherwise."""

    def release(self) -> None:
        """Give the lease back (the context was finished or handed back); nothing more is written under it."""

    def hold(self, checkpoint: str | None = None) -> AbstractContextManager[str | None]:
        """Hold the lease through one effect outside the context (a push, a forge write): :class:`~contexts.errors.
        FencedError`, before the effect, unless this epoch is current, and no taker moves the epoch until the block
        ends. ``checkpoint``: the commit the effect puts on the task's checkpoint branch (``""``: it deletes the
        branch), recorded under this epoch when the block ends without an error. Yields the checkpoint recorded
        last (what a push is leased on), None where nothing records one (one host)."""


@dataclass(frozen=True)
class Committed:
    """A context as the durable copy has it, and its lease: what a host without its directory knows of it (the
    monitor's view of a task another host held)."""

    metadata: Mapping[str, Any]
    state: Mapping[str, Any]
    """The last committed ``state.json``."""
    owner: str | None
    """The lease's holder and epoch (``hostname:pid#epoch``); None once released."""
    live: bool
    """The lease is held and has not run out, by the store's clock."""


class DurableCopy(Protocol):
    """Where a store keeps its contexts beside the host's directories, and whose lease says who holds one."""

    def create(self, uuid: str, holder: str, metadata: Mapping[str, Any], state: Mapping[str, Any]) -> DurableWriter:
        """Record a new context and take its first lease; :class:`~contexts.errors.ContextExistsError` if known."""

    def take(self, uuid: str, holder: str) -> DurableWriter:
        """Take the lease of an existing context (a new epoch fences the previous holder);
        :class:`~contexts.errors.LockHeldError` while another holder's lease is live."""

    def rebuild(self, uuid: str, directory: Path) -> None:
        """Write the context's files (SPEC §3: metadata, state, the three JSONL files) into the empty ``directory``
        from the durable copy; :class:`~contexts.errors.ContextNotFoundError` when it has no such context."""

    def knows(self, uuid: str) -> bool:
        """Whether the durable copy has the context (so a host without its directory can rebuild it)."""

    def committed(self, uuid: str) -> Committed | None:
        """The context's metadata, last committed state and lease; None when the durable copy has no such context."""

    def amend(self, uuid: str, change: Amendment) -> Mapping[str, Any] | None:
        """A write to the committed state by someone other than its holder, under no lease (a cancel request,
        usage metered after the task ended): ``change`` gets the committed state, locked against every other
        writer until the write lands, and returns the state to write (None: nothing). The holder's later commits
        keep a ``cancel_requested`` written here; anything else a holder may overwrite, so ``change`` writes it
        only where no holder writes any more (a final status). Returns the committed state as it is afterwards;
        None when the durable copy has no such context (one host keeps none)."""

    def expired(self, limit: int = 1000) -> list[str]:
        """Contexts whose lease ran out without a release, by the store's clock (their holder is lost, wherever it
        ran), oldest first and at most ``limit``; those in a final status are not among them (one host: none)."""

    def ended_before(self, before: datetime, limit: int = 10_000) -> list[tuple[str, datetime]]:
        """``(uuid, completed_at)`` of the contexts in a final status, whichever host ran them, whose copy was last
        written before ``before`` (by the store's clock), oldest first and at most ``limit``: what retention may
        :meth:`forget` once ``completed_at`` is old enough (one host: none)."""

    def forget(self, uuid: str) -> bool:
        """Delete the context's durable copy (its lines, its lease and its checkpoint with it) in one transaction,
        only while its committed status is final (never a task still running); True when the copy has it no more
        (forgotten now or before), False when it refused. One host keeps no copy: True."""


Amendment = Callable[[dict[str, Any]], Mapping[str, Any] | None]
"""What :meth:`DurableCopy.amend` does to a committed state: the state to write, or None to write nothing."""


class _NoWriter:
    """One host: the directory is the only copy and the ``.lock`` the only ownership."""

    epoch = 0
    cancel_requested = False

    def check(self) -> None:
        return None

    def renew(self) -> None:
        return None

    def record(self, file: str, record_id: int, line: str) -> None:
        return None

    def commit(self, state: Mapping[str, Any] | None) -> None:
        return None

    def release(self) -> None:
        return None

    def hold(self, checkpoint: str | None = None) -> AbstractContextManager[str | None]:
        return nullcontext(None)  # the .lock's owner check (Context.holding) is one host's whole fence


class _OneHost:
    """No durable copy beside the directories (``fleet.store`` unset)."""

    def create(self, uuid: str, holder: str, metadata: Mapping[str, Any], state: Mapping[str, Any]) -> DurableWriter:
        return NO_WRITER

    def take(self, uuid: str, holder: str) -> DurableWriter:
        return NO_WRITER

    def rebuild(self, uuid: str, directory: Path) -> None:
        raise ContextNotFoundError(f"no context {uuid}: one host keeps no copy beside its directories")

    def knows(self, uuid: str) -> bool:
        return False

    def committed(self, uuid: str) -> Committed | None:
        return None

    def amend(self, uuid: str, change: Amendment) -> Mapping[str, Any] | None:
        return None  # the directory is the only copy: its writers write state.json themselves

    def expired(self, limit: int = 1000) -> list[str]:
        return []  # no leases: the .lock and the heartbeat index find lost holders

    def ended_before(self, before: datetime, limit: int = 10_000) -> list[tuple[str, datetime]]:
        return []  # the directories are every context there is: retention reads them

    def forget(self, uuid: str) -> bool:
        return True  # nothing kept beside the directory


NO_WRITER: DurableWriter = _NoWriter()
ONE_HOST: DurableCopy = _OneHost()
