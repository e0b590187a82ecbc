"""MCP client sessions kept for a task's life on an event loop of their own (the SDK is async, the loop is not).

:class:`EventLoop` is one thread running an asyncio loop; the agent's thread hands it coroutines and waits with a
deadline. :class:`ServerSession` holds one server's ``ClientSession`` open in a task of that loop, from
:meth:`~ServerSession.start` to :meth:`~ServerSession.close`: the SDK's transports are context managers that must be
entered and left in the same task, and leaving them stops the server (a stdio server's process tree is killed).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import mcp_types
from mcp import ClientSession
from mcp.client._transport import TransportStreams

from contexts.errors import TasukiError

T = TypeVar("T")
CLOSE_GRACE_S = 10.0  # a server's transport gets this long to wind down (the SDK bounds its own waits)
MAX_LISTED_PAGES = 20  # tools/list pages read from one server
Opener = Callable[[], AbstractAsyncContextManager[TransportStreams]]


class MCPUnavailable(TasukiError):
    """An MCP server did not start, did not answer in time, or is gone; the message is one line."""


class EventLoop:
    """An asyncio loop in a daemon thread of its own, for a task's life."""

    def __init__(self, name: str = "tasuki-mcp") -> None:
        self.loop = asyncio.new_event_loop()
        # The thread runs in a copy of this context: its log lines carry the task's bound fields.
        self._thread = threading.Thread(
            target=contextvars.copy_context().run, args=(self._main,), name=name, daemon=True
        )
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            with contextlib.suppress(RuntimeError):
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run ``coroutine`` on the loop and wait for it at most ``timeout_s``; TimeoutError (it is cancelled)."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def stop(self, timeout_s: float = CLOSE_GRACE_S) -> None:
        """Stop the loop and wait for its thread (the processes it started die with it: ``--die-with-parent``)."""
        with contextlib.suppress(RuntimeError):  # already closed
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)


class ServerSession:
    """One server's session, opened by ``opener`` (a stdio or a streamable-HTTP transport)."""

    def __init__(self, name: str, opener: Opener) -> None:
        self.name = name
        self.opener = opener
        self.session: ClientSession | None = None
        self.tools: list[mcp_types.Tool] = []
        self.failure: str | None = None  # why the session ended, once it did
        self._ready: asyncio.Event | None = None
        self._closing: asyncio.Event | None = None
        self._keeper: asyncio.Task[None] | None = None

    async def start(self, timeout_s: float) -> list[mcp_types.Tool]:
        """Open the session and list the server's tools; MCPUnavailable when it cannot in ``timeout_s``."""
        self._ready, self._closing = asyncio.Event(), asyncio.Event()
        self._keeper = asyncio.create_task(self._keep(), name=f"mcp-{self.name}")
        try:
            await asyncio.wait_for(self._ready.wait(), timeout_s)
        except TimeoutError:
            await self.close()
            raise MCPUnavailable(f"did not start and list its tools within {timeout_s:g} s") from None
        if self.session is None:
            await self.close()
            raise MCPUnavailable(f"did not start: {self.failure or 'it ended before it listed its tools'}")
        return self.tools

    async def _keep(self) -> None:
        assert self._ready is not None  # noqa: S101 - set by start()
        assert self._closing is not None  # noqa: S101 - set by start()
        try:
            async with self.opener() as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                self.tools = await _list_tools(session)
                self.session = session
                self._ready.set()
                await self._closing.wait()
        except asyncio.CancelledError:
            self.failure = self.failure or "stopped"
            raise
        except BaseException as exc:  # every way a server fails is one line for the model and the log
            self.failure = describe(exc)
        finally:
            self.session = None
            self.failure = self.failure or "the session ended"
            self._ready.set()

    async def call(self, tool: str, arguments: dict[str, Any], timeout_s: float) -> mcp_types.CallToolResult:
        """Call ``tool``; MCPUnavailable when the server is gone or does not answer in ``timeout_s``."""
        session = self.session
        if session is None:
            raise MCPUnavailable(f"the server is not running ({self.failure or 'never started'})")
        keeper = self._keeper
        call = asyncio.ensure_future(session.call_tool(tool, arguments, read_timeout_seconds=timeout_s))
        waits: set[asyncio.Future[Any]] = {call} if keeper is None else {call, keeper}
        done, _ = await asyncio.wait(waits, timeout=timeout_s + 1, return_when=asyncio.FIRST_COMPLETED)
        if call not in done:
            call.cancel()
            with contextlib.suppress(BaseException):
                await call
            if keeper is not None and keeper in done:
                raise MCPUnavailable(f"the server stopped during the call ({self.failure})")
            raise MCPUnavailable(f"no answer within {timeout_s:g} s")
        try:
            return call.result()
        except asyncio.CancelledError:
            raise MCPUnavailable("the call was cancelled") from None
        except Exception as exc:
            said = describe(exc)
            if "timed out" in said:  # the SDK's own deadline (the request's read timeout)
                raise MCPUnavailable(f"no answer within {timeout_s:g} s") from None
            if "Connection closed" in said:
                raise MCPUnavailable("the server closed the connection (it exited or crashed)") from None
            raise MCPUnavailable(said) from None

    async def close(self) -> None:
        """End the session (a stdio server is stopped with it); bounded by :data:`CLOSE_GRACE_S`."""
        if self._closing is not None:
            self._closing.set()
        keeper = self._keeper
        if keeper is None or keeper.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(keeper), CLOSE_GRACE_S)
        except (TimeoutError, asyncio.CancelledError):
            keeper.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(keeper, CLOSE_GRACE_S)


async def _list_tools(session: ClientSession) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(MAX_LISTED_PAGES):
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        listed = await session.list_tools(params=params)
        tools += listed.tools
        cursor = listed.next_cursor
        if not cursor:
            break
    return tools


def describe(exc: BaseException) -> str:
    """One line for an exception out of the SDK (a task group's group of them: its first)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__
