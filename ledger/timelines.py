"""The server timeline under the ledger: how a process notices that the ledger failed over.

A promoted standby starts a new PostgreSQL timeline. Every connection the ledger opens reads the
server's timeline once, right after its session settings. The first time a process meets a timeline
above the one it knew, the ledger it serves failed over while it ran: it records the timeline in
`onceflow_timelines` (with when it was first seen, migration 0024) and tells its listeners, and the
ledger then checks the writes it saw acknowledged before (ledger/lost_writes.py). A timeline is
recorded even by a process that knew no earlier one, so a call attempted before a switch can later be
told apart from one attempted after it (`switch_since`).

A server whose timeline cannot be read (a managed service that hides the WAL functions) leaves the
timeline unknown: the rest of the ledger works as before, without the checks that depend on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import asyncpg

from onceflow.ledger import queries

log = logging.getLogger("onceflow.ledger")

# Called with (the timeline known before, the new one) when a process meets a higher timeline.
TimelineListener = Callable[[int, int], Awaitable[None]]


class Timelines:
    """The highest server timeline this process has seen, and who to tell when it rises."""

    def __init__(self, process: str = "onceflow") -> None:
        self.process = process
        self.current: int | None = None
        self.unreadable: str | None = None  # why the timeline cannot be read, once it could not
        self._listeners: list[TimelineListener] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def listen(self, listener: TimelineListener) -> None:
        self._listeners.append(listener)

    async def observe(self, conn: asyncpg.Connection) -> None:
        """Read the timeline of the server `conn` reaches; record it and tell the listeners if new."""
        try:
            timeline: int = await conn.fetchval(queries.TIMELINE)
        except asyncpg.PostgresError as exc:
            if self.unreadable is None:
                log.warning("the ledger cannot read its server's timeline, failovers go unnoticed: %s", exc)
            self.unreadable = str(exc)
            return
        if self.current is not None and timeline <= self.current:
            return
        previous, self.current = self.current, timeline
        if previous is not None:
            self._tell(previous, timeline)  # before any await: whoever sees the new timeline may wait
        await _record(conn, timeline, self.process)

    def _tell(self, previous: int, timeline: int) -> None:
        log.warning(
            "the ledger's server is on timeline %d, this process knew %d: it failed over; "
            "checking the writes acknowledged before",
            timeline,
            previous,
        )
        for listener in self._listeners:
            # Not awaited here: this runs while the pool opens a connection, and the check needs one.
            task = asyncio.ensure_future(listener(previous, timeline))
            self._tasks.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("checking the ledger after a failover failed: %r", task.exception())

    async def settled(self) -> None:
        """Wait for the listeners started so far (tests, and closing the ledger)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


async def _record(conn: asyncpg.Connection, timeline: int, process: str) -> None:
    # A record lost in a second failover is written again, later, which only widens the window in
    # which calls are doubted.
    try:
        await conn.execute(queries.RECORD_TIMELINE, timeline, process)
    except asyncpg.PostgresError as exc:  # not migrated yet, a role that may not write it...
        log.warning("timeline %d not recorded in onceflow_timelines: %s", timeline, exc)


async def switch_since(conn: Any, since: datetime) -> tuple[int, datetime] | None:
    """The first timeline switch the ledger saw at or after `since`, as (timeline, first seen)."""
    row = await conn.fetchrow(queries.SWITCH_SEEN_SINCE, since)
    return None if row is None else (row["timeline"], row["first_seen_at"])
