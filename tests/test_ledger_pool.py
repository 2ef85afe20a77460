"""The ledger hands its connections back to the pool without waiting (ledger/base.py, `_release_later`).

What that must not cost: a connection kept out of the pool, a pool that grows with every call, a
failed release nobody hears of, or a close that leaves a release behind.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest

from onceflow.ledger import CallIdentity, Ledger, SideEffect


async def _settled(pool: asyncpg.Pool) -> None:
    """Until every open connection is back in the pool (a second at most)."""
    for _ in range(100):
        if pool.get_idle_size() == pool.get_size():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{pool.get_size() - pool.get_idle_size()} connections never came back")


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


async def test_close_right_after_a_call_waits_for_its_release(database_url: str) -> None:
    ledger = await Ledger.connect(database_url)
    async with ledger.connection("probe") as conn:
        assert await conn.fetchval("SELECT 1") == 1
    await ledger.close()  # the release is still under way here
    assert ledger._pool.get_size() == 0


async def test_a_failed_release_is_logged_and_the_next_call_gets_a_new_connection(
    ledger: Ledger, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    killer = await asyncpg.connect(database_url)
    try:
        async with ledger.connection("probe") as conn:
            # A transaction left open makes the release roll it back over the wire: on a
            # connection whose backend is gone, that fails.
            await conn.execute("BEGIN")
            backend = await conn.fetchval("SELECT pg_backend_pid()")
            assert await killer.fetchval("SELECT pg_terminate_backend($1)", backend)
        with caplog.at_level(logging.WARNING, logger="onceflow.ledger"):
            await _settled(ledger._pool)
            for _ in range(100):
                if any("ledger pool failed" in r.getMessage() for r in caplog.records):
                    break
                await asyncio.sleep(0.01)
        assert any("ledger pool failed" in r.getMessage() for r in caplog.records)
        async with ledger.connection("probe") as conn:
            assert await conn.fetchval("SELECT pg_backend_pid()") != backend
    finally:
        await killer.close()
