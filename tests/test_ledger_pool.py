"""The ledger hands its connections back to the pool without waiting (ledger/base.py, `_release_later`).

What that must not cost: a connection kept out of the pool, a pool that grows with every call, a
dead connection handed out again, a failed release nobody hears of, or a close that leaves a
release behind.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest

from onceflow.ledger import CallIdentity, Ledger, SideEffect
from onceflow.ledger.base import _release_later
from tests.support.waiting import eventually


async def _settled(pool: asyncpg.Pool) -> None:
    """Until every open connection is back in the pool."""

    async def all_idle() -> bool:
        return pool.get_idle_size() == pool.get_size()

    await eventually(all_idle, "every connection back in the pool", timeout=1, every=0.01)


def _release_failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "ledger pool failed" in r.getMessage()]


async def test_back_to_back_calls_share_two_connections_at_most(ledger: Ledger) -> None:
    for n in range(60):
        call = CallIdentity(tenant="t", run_id="run-pool", tool_call_id=f"call_{n}", agent="a")
        await ledger.reserve(
            call, tool_name="issue_credit", side_effect=SideEffect.EXTERNAL, arguments={"n": n}, owner="w"
        )
        await ledger.complete(call.key, owner="w", result={"ok": n})
    pool = ledger._pool
    await _settled(pool)
    # A release runs on the loop's next turn; a call made at once takes another connection, and the
    # two alternate from then on. More than two would mean releases are left behind.
    assert pool.get_size() <= 2


async def test_close_right_after_a_call_waits_for_its_release(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = await Ledger.connect(database_url)
    with caplog.at_level(logging.WARNING, logger="onceflow.ledger"):
        async with ledger.connection("probe") as conn:
            assert await conn.fetchval("SELECT 1") == 1
        await ledger.close()  # the release is still under way here
        await asyncio.sleep(0.05)  # a release left behind would now meet a closed pool, and fail
    assert ledger._pool.get_size() == 0
    assert _release_failures(caplog) == []


async def test_a_connection_whose_backend_died_is_dropped_and_the_next_call_gets_a_new_one(
    ledger: Ledger, database_url: str
) -> None:
    killer = await asyncpg.connect(database_url)
    try:
        async with ledger.connection("probe") as conn:
            await conn.execute("BEGIN")  # left open: a live connection's release would roll it back
            backend = await conn.fetchval("SELECT pg_backend_pid()")
            assert await killer.fetchval("SELECT pg_terminate_backend($1)", backend)

            async def gone() -> bool:  # terminating is asynchronous: wait until the backend has exited
                await killer.execute("SELECT pg_stat_clear_snapshot()")
                return not await killer.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", backend
                )

            await eventually(gone, f"backend {backend} to exit", timeout=5, every=0.01)
        await _settled(ledger._pool)
        async with ledger.connection("probe") as conn:
            assert await conn.fetchval("SELECT pg_backend_pid()") != backend
    finally:
        await killer.close()


async def test_a_release_that_raises_is_logged(
    ledger: Ledger, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    other = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
    try:
        conn = await other.acquire()
        with caplog.at_level(logging.WARNING, logger="onceflow.ledger"):
            # Not a connection of the ledger's pool: asyncpg's release refuses it (InterfaceError).
            _release_later(ledger._pool, conn)

            async def logged() -> bool:
                return bool(_release_failures(caplog))

            await eventually(logged, "the failed release to be logged", timeout=1, every=0.01)
        assert "is not a member of this pool" in _release_failures(caplog)[0]
        await other.release(conn)
    finally:
        await other.close()
