"""The ledger's connections: the session settings every one gets, handing them out between
operations over asyncpg's pool, and one operation (a span around one connection)."""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Any, TypeVar

import asyncpg
from opentelemetry import context, trace

from onceflow.ledger.errors import LedgerUnavailableError

tracer = trace.get_tracer("onceflow.ledger")
log = logging.getLogger("onceflow.ledger")
_E = TypeVar("_E", bound=BaseException | None)

# Driver errors that mean "the database is not there right now": nothing is known to have changed.
UNAVAILABLE = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.ConnectionFailureError,
)


# While a statement runs, its backend polls the client's socket this often and aborts the statement
# if the client has gone (PostgreSQL 14 and later; ledger.migrate refuses anything older than 15). A
# guarded reservation is one statement: without this, one that waits on a guard's lock for a worker
# that was killed meanwhile would commit once the lock came free, leaving a `started` call that
# nobody sent.
CLIENT_CHECK_INTERVAL = "100ms"
# The guards decide inside one statement, after advisory locks, and rely on each statement seeing
# what committed before it began: READ COMMITTED. Under REPEATABLE READ the function's statements
# would read the snapshot taken before the locks were waited for, and two twins waiting on one
# intent lock would both find no twin and both be sent. A database (or role) default of another
# level is overridden on the ledger's own connections (ledger/migrate.py reports such a default).
ISOLATION = "read committed"
# The server probes an idle client's socket after this many seconds, this often, this many times:
# a worker whose host vanished without closing its socket is noticed while a statement of its waits
# on a lock, which client_connection_check_interval alone cannot see (it sees closed sockets only).
# Keepalives only probe a socket with nothing unacknowledged on it: when the host vanished while the
# server's answer was on its way (a statement that ended just then), the kernel retransmits instead,
# for up to about 15 minutes, holding the transaction's locks. tcp_user_timeout (milliseconds)
# closes such a connection once data has gone unacknowledged that long (tests/test_partitions.py).
# No effect over a Unix socket.
KEEPALIVES = {
    "tcp_keepalives_idle": 10,
    "tcp_keepalives_interval": 5,
    "tcp_keepalives_count": 3,
    "tcp_user_timeout": 25_000,
}
SESSION_SETTINGS = "; ".join(
    [
        f"SET client_connection_check_interval = '{CLIENT_CHECK_INTERVAL}'",
        f"SET default_transaction_isolation = '{ISOLATION}'",
        *(f"SET {name} = {value}" for name, value in KEEPALIVES.items()),
    ]
)


async def set_up_session(conn: asyncpg.Connection) -> None:
    """Every new pooled connection: the session settings the ledger makes, the same on all, in one
    round trip."""
    await conn.execute(SESSION_SETTINGS)


async def keep_session(conn: asyncpg.Connection) -> None:
    """Release a connection to the pool without asyncpg's reset query (one round trip per call).

    The ledger changes no session state after `set_up_session` (no SET, LISTEN, cursors or advisory locks
    held past a transaction), and asyncpg still rolls back a transaction left open before calling this.
    """


# Releases under way: the event loop keeps only weak references to its tasks.
_RELEASING: set[asyncio.Task[None]] = set()


def release_later(pool: asyncpg.Pool, conn: Any) -> None:
    """Give the connection back to asyncpg's pool without waiting for it.

    asyncpg's `Pool.release` runs under `asyncio.shield`, a task of its own: awaiting it costs the
    caller two turns of the event loop after a statement whose answer is already in hand. The
    release is left to run on its own instead; asyncpg's pool is built for that (a connection is
    only handed out again once its release has run, and `Pool.close` waits for every release). A
    release that fails has already closed its connection: it is logged, and the pool opens a new one
    when it needs one.
    """
    task = asyncio.ensure_future(pool.release(conn))
    _RELEASING.add(task)
    task.add_done_callback(_released)


def _released(task: asyncio.Task[None]) -> None:
    _RELEASING.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("returning a connection to the ledger pool failed: %r", task.exception())


# How long a connection may stay with the ledger unused before it goes back to asyncpg's pool,
# whose own inactivity timer (300 s by default) then closes it.
KEEP_IDLE_SECONDS = 60.0


def still_open(conn: Any) -> bool:
    """Is this pooled connection still open? asyncpg hands a connection that closed (the server went
    away, its backend was killed) back to its pool by itself, after which the connection answers
    every call with InterfaceError."""
    try:
        return not conn.is_closed()
    except asyncpg.InterfaceError:
        return False


class Connections:
    """The ledger's connections between operations, over asyncpg's pool.

    asyncpg's pool opens every connection (with `set_up_session`), bounds how many there are, cleans up
    after a failed or cancelled statement and closes them. But handing a connection back to it takes
    a task of its own and two or three turns of the event loop, each a system call, after every
    statement: as much client CPU as the statement itself (docs/benchmarks.md, "Issue 22, seventh
    pass"). So a connection that an operation leaves clean (it ended without an exception, no
    transaction is open, the connection is not closed) stays here, and the next operation takes it
    back at once. Every other connection goes back to asyncpg's pool: one that saw an error or a
    cancellation, every connection while some operation waits on the pool for one (it would
    otherwise wait for a connection kept here), one unused for `KEEP_IDLE_SECONDS`, and all of them
    at close.
    """

    __slots__ = ("_closed", "_idle", "_pool", "_timer", "_waiting", "keep_idle_seconds")

    def __init__(self, pool: asyncpg.Pool, keep_idle_seconds: float = KEEP_IDLE_SECONDS) -> None:
        self._pool = pool
        self._idle: list[tuple[Any, float]] = []  # (connection, when it was left here), newest last
        self._waiting = 0
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self.keep_idle_seconds = keep_idle_seconds

    async def acquire(self) -> Any:
        idle = self._idle
        while idle:
            conn, _ = idle.pop()
            if still_open(conn):
                return conn
            release_later(self._pool, conn)  # closed meanwhile: asyncpg tidies up, if it has not
        self._waiting += 1
        try:
            return await self._pool.acquire()
        finally:
            self._waiting -= 1

    def release(self, conn: Any, *, clean: bool) -> None:
        if not clean or self._waiting or self._closed or not still_open(conn) or conn.is_in_transaction():
            release_later(self._pool, conn)
            return
        loop = asyncio.get_running_loop()
        self._idle.append((conn, loop.time()))
        if self._timer is None:
            self._timer = loop.call_later(self.keep_idle_seconds, self._give_back_unused)

    def _give_back_unused(self) -> None:
        """Hand the connections unused for `keep_idle_seconds` back to asyncpg's pool."""
        self._timer = None
        loop = asyncio.get_running_loop()
        cutoff = loop.time() - self.keep_idle_seconds
        unused = [conn for conn, since in self._idle if since <= cutoff]
        self._idle = [(conn, since) for conn, since in self._idle if since > cutoff]
        for conn in unused:
            release_later(self._pool, conn)
        if self._idle:  # the oldest left decides when to look again
            self._timer = loop.call_at(self._idle[0][1] + self.keep_idle_seconds, self._give_back_unused)

    async def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        idle, self._idle = self._idle, []
        for conn, _ in idle:
            release_later(self._pool, conn)
        await self._pool.close()  # waits for every release, and for operations still under way

    def idle_count(self) -> int:
        return len(self._idle)


class NotOpenYet(Connections):
    """The connections of a ledger made with `LedgerBase.opened_later()`, until `open`: every
    operation meets the database as away (LedgerUnavailableError), which each caller already treats
    as "nothing was done" (a write activity is then reserved again later, never sent)."""

    __slots__ = ()

    def __init__(self) -> None:  # no pool: nothing is ever acquired
        pass

    async def acquire(self) -> Any:
        raise LedgerUnavailableError("the ledger is not open yet: its worker has not started")

    def release(self, conn: Any, *, clean: bool) -> None:
        pass

    async def close(self) -> None:
        pass

    def idle_count(self) -> int:
        return 0


class Operation:
    """One ledger operation: a `ledger.<name>` span around one of the ledger's connections.

    Written as one context manager rather than three nested ones (a span, making it current, a
    checkout) because it runs twice per side-effecting tool call. It ends the span the way
    `Tracer.start_as_current_span` does, recording an exception as the span's error.
    """

    __slots__ = ("_attributes", "_conn", "_connections", "_name", "_span", "_token")

    def __init__(self, connections: Connections, name: str, attributes: dict[str, str]) -> None:
        self._connections = connections
        self._name = name
        self._attributes = attributes

    async def __aenter__(self) -> Any:  # an asyncpg connection (Any, for the callers' typing)
        self._span = tracer.start_span(f"ledger.{self._name}", attributes=self._attributes)
        self._token = context.attach(trace.set_span_in_context(self._span))
        try:
            self._conn = await self._connections.acquire()
        except UNAVAILABLE as exc:
            raise self._end(LedgerUnavailableError(f"ledger {self._name} failed: {exc}")) from exc
        except asyncpg.PostgresError as exc:
            # Refused while connecting ("not currently accepting connections", "too many
            # clients"...): no statement ran, so this is the database being away, nothing more.
            raise self._end(LedgerUnavailableError(f"ledger {self._name} failed to connect: {exc}")) from exc
        except BaseException as exc:
            self._end(exc)
            raise
        return self._conn

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._connections.release(self._conn, clean=exc is None)
        if isinstance(exc, UNAVAILABLE):
            raise self._end(LedgerUnavailableError(f"ledger {self._name} failed: {exc}")) from exc
        self._end(exc)

    def _end(self, exc: _E) -> _E:
        """Leave the span's context and end it, recording `exc` as its error; returns `exc`."""
        context.detach(self._token)
        span = self._span
        if isinstance(exc, Exception) and span.is_recording():
            span.record_exception(exc)
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        span.end()
        return exc
