"""One live MCP session per server per worker process, shared by every call and re-made when it dies.

The official SDK's `Client` must be entered and left in one task (anyio cancel scopes), so each
session lives in a task of its own that holds it open until it is discarded; calls from activities
use it from their own tasks. A write first makes sure the session answers a request: a server that
cannot be reached or started at that point has certainly not received the call ("not attempted").
Anything that goes wrong after the request was handed to the transport is the caller's to call
unknown, and the session is discarded so the next call starts a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from onceflow.mcp.config import McpConfigError, McpServerConfig
from onceflow.sdk.variables import expand_variables

if TYPE_CHECKING:
    from mcp import Client
    from mcp.types import CallToolResult, Tool

log = logging.getLogger("onceflow.mcp")


class McpUnavailableError(Exception):
    """The server could not be started, reached or initialized: nothing was sent to it."""


def _install_hint() -> str:
    return "MCP toolsets need the official SDK: pip install 'onceflow[mcp]'"


def _make_client(name: str, config: McpServerConfig, on_http_error: Callable[[str], None]) -> Client:
    try:
        from mcp import Client, StdioServerParameters
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client
    except ImportError as exc:
        raise McpUnavailableError(_install_hint()) from exc
    where = f"mcp_servers.{name}"
    if config.command is not None:
        params = StdioServerParameters(
            command=config.command,
            args=[expand_variables(arg, f"{where}.args") for arg in config.args],
            env={key: expand_variables(value, f"{where}.env.{key}") for key, value in config.env.items()},
            cwd=config.cwd,
        )
        # No response cache: a listing must be what the server says now, and calls never hit it anyway.
        return Client(params, cache=None)
    assert config.url is not None
    headers = {
        key: expand_variables(value, f"{where}.headers.{key}") for key, value in config.headers.items()
    }
    http = create_mcp_http_client(headers=headers)

    async def note_errors(response: Any) -> None:
        # The SDK's error for a refused request does not say which status came back; operators need it.
        if response.status_code >= 400:
            on_http_error(
                f"HTTP {response.status_code} from {response.request.method} {response.request.url}"
            )

    http.event_hooks["response"].append(note_errors)

    @contextlib.asynccontextmanager
    async def transport() -> AsyncIterator[Any]:
        # The SDK leaves a client it was given open; this one is ours to close with the session.
        async with http, streamable_http_client(url, http_client=http) as streams:
            yield streams

    url = config.url
    return Client(transport(), cache=None)


class McpConnection:
    """The session with one MCP server. `session()` connects on first use and after a failure."""

    def __init__(self, name: str, config: McpServerConfig) -> None:
        self.name = name
        self.config = config
        self._lock = asyncio.Lock()
        self._client: Client | None = None
        self._release: asyncio.Event | None = None
        self._holder: asyncio.Task[None] | None = None
        # A session being opened. Its own task, so a caller giving up (its tool's deadline) does not
        # abandon a start that is nearly done: the next call finds the session ready.
        self._opening: asyncio.Task[Client] | None = None
        self.sessions_opened = 0
        self._last_http_error: str | None = None

    def _note_http_error(self, error: str) -> None:
        self._last_http_error = error

    async def _open(self) -> Client:
        try:
            return await self._start()
        finally:
            if self._opening is asyncio.current_task():
                self._opening = None

    async def _start(self) -> Client:
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        release = asyncio.Event()
        self._last_http_error = None
        try:
            client = _make_client(self.name, self.config, self._note_http_error)
        except McpConfigError as exc:  # e.g. an unset ${VAR}: nothing can be sent
            raise McpUnavailableError(str(exc)) from exc

        async def hold() -> None:
            try:
                async with client:
                    ready.set_result(client)
                    await release.wait()
            except BaseException as exc:  # the session ended; whoever waits for it must hear why
                if not ready.done():
                    ready.set_exception(exc if isinstance(exc, Exception) else McpUnavailableError(repr(exc)))
                elif not isinstance(exc, asyncio.CancelledError):
                    log.info("MCP session with %s ended: %r", self.name, exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
            finally:
                if self._client is client:
                    self._client = None

        holder = asyncio.create_task(hold(), name=f"mcp-session:{self.name}")
        try:
            opened = await asyncio.wait_for(
                asyncio.shield(ready), self.config.connect_timeout.total_seconds()
            )
        except BaseException as exc:
            release.set()
            holder.cancel()
            await asyncio.gather(holder, return_exceptions=True)
            if isinstance(exc, asyncio.CancelledError):
                raise
            if isinstance(exc, TimeoutError):
                raise McpUnavailableError(
                    f"did not start and initialize within {self.config.connect_timeout.total_seconds():g}s"
                ) from exc
            seen = f" ({self._last_http_error})" if self._last_http_error else ""
            raise McpUnavailableError(f"cannot start or reach it: {_describe(exc)}{seen}") from exc
        self._client, self._release, self._holder = opened, release, holder
        self.sessions_opened += 1
        log.info("MCP session %d with %s open", self.sessions_opened, self.name)
        return opened

    async def session(self, *, check: bool = True) -> Client:
        """A live session: the current one (if `check`, only once it answered a listing), else a new one.

        Raises McpUnavailableError when no session can be had; nothing was sent then.
        """
        async with self._lock:
            client = self._client
            if client is not None and check:
                try:
                    # A listing is the one cheap request every protocol version answers (ping is
                    # gone as of 2026-07-28).
                    await asyncio.wait_for(
                        client.list_tools(cache_mode="refresh"), self.config.connect_timeout.total_seconds()
                    )
                except Exception as exc:
                    log.info("MCP server %s did not answer (%r); starting a new session", self.name, exc)
                    await self._discard()
                    client = None
            if client is not None:
                return client
            if self._opening is None:
                self._opening = asyncio.create_task(self._open(), name=f"mcp-connect:{self.name}")
                # Retrieved here too, so a start nobody waits for any more does not log a lost error.
                self._opening.add_done_callback(lambda task: task.cancelled() or task.exception())
            opening = self._opening
        return await asyncio.shield(opening)

    async def discard(self, client: Client) -> None:
        """Drop `client`'s session after a transport failure; the next call opens a new one.

        Only if it is still the current one: a late failure on a session already replaced must not
        cut the calls in flight on its successor."""
        async with self._lock:
            if self._client is client:
                await self._discard()

    async def _discard(self) -> None:
        release, holder = self._release, self._holder
        self._client = self._release = self._holder = None
        if release is not None:
            release.set()
        if holder is not None:
            # Shielded: a caller that gives up does not interrupt the session's own shutdown.
            try:
                await asyncio.wait_for(asyncio.shield(holder), 5)
            except TimeoutError:
                holder.cancel()
                log.warning("MCP session with %s did not close within 5s; cancelled", self.name)

    async def list_tools(self) -> list[Tool]:
        """Every tool the server lists, following pagination."""
        client = await self.session(check=False)
        tools: list[Tool] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def call_tool(
        self, client: Client, name: str, arguments: dict[str, Any], meta: dict[str, Any] | None
    ) -> CallToolResult:
        """Send one `tools/call` on `client` (from `session()`), exactly once.

        The SDK's `Client.call_tool` may send a call twice (it re-lists and resends on a header
        mismatch, and answers input requests with further rounds); the session's own `call_tool`
        sends once, and refuses input requests instead of answering them.
        """
        return await client.session.call_tool(name, arguments, meta=meta)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        async with self._lock:
            opening, self._opening = self._opening, None
            if opening is not None:
                opening.cancel()
                await asyncio.gather(opening, return_exceptions=True)
            await self._discard()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in exc.exceptions)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
