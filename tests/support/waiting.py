"""Waiting for something real to happen (a run to pause, a row to appear, a session to wait at a
lock), with a bound."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import asyncpg


async def eventually(
    check: Callable[[], Awaitable[bool]], what: str, timeout: float = 30, every: float = 0.1
) -> None:
    """Poll `check` until it is true; an AssertionError naming `what` after `timeout` seconds."""

    async def poll() -> None:
        while not await check():
            await asyncio.sleep(every)

    try:
        await asyncio.wait_for(poll(), timeout)
    except TimeoutError:
        raise AssertionError(f"gave up after {timeout}s waiting for {what}") from None


async def sessions_waiting_on_a_lock(conn: asyncpg.Connection) -> int:
    """How many other sessions of this database wait for a lock right now. (Inside a transaction
    pg_stat_activity answers from a snapshot taken at its first read: cleared first.)"""
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
    )


async def until_waiting(conn: asyncpg.Connection, sessions: int, what: str) -> None:
    async def waiting() -> bool:
        return await sessions_waiting_on_a_lock(conn) >= sessions

    await eventually(waiting, what)
