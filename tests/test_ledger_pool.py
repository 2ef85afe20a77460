"""The ledger keeps a clean connection between operations and gives every other back to asyncpg's pool
(ledger/connections.py, `Connections`).

What that must not cost: a connection kept out of reach of an operation that waits for one, a
transaction or a cancelled statement carried into the next operation, a dead connection handed out
again, connections held for good by an idle worker, a failed release nobody hears of, or a close
that leaves a connection or a release behind.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest

from onceflow.ledger import CallIdentity, Ledger, LedgerUnavailableError, SideEffect
from onceflow.ledger.connections import release_later, still_open
from tests.support.waiting import eventually


async def _settled(pool: asyncpg.Pool) -> None:
    """Until every connection asyncpg's pool holds is idle in it."""

    async def all_idle() -> bool:
        return pool.get_idle_size() == pool.get_size()

    await eventually(all_idle, "every connection back in the pool", timeout=1, every=0.01)


def _release_failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "ledger pool failed" in r.getMessage()]


async def _backend(ledger: Ledger) -> int:
    async with ledger.connection("probe") as conn:
        return int(await conn.fetchval("SELECT pg_backend_pid()"))


async def test_back_to_back_calls_keep_one_connection(ledger: Ledger) -> None:
    first = await _backend(ledger)
    for n in range(30):
        call = CallIdentity(tenant="t", run_id="run-pool", tool_call_id=f"call_{n}", agent="a")
        await ledger.reserve(
            call, tool_name="issue_credit", side_effect=SideEffect.EXTERNAL, arguments={"n": n}, owner="w"
        )
        await ledger.complete(call.key, owner="w", result={"ok": n})
    assert await _backend(ledger) == first
    assert ledger._pool.get_size() == 1  # asyncpg's pool opened no second one
    assert ledger._connections.idle_count() == 1


async def test_an_idle_connection_is_taken_without_a_turn_of_the_event_loop(ledger: Ledger) -> None:
    await _backend(ledger)  # one connection, now kept by the ledger
    # A task scheduled now runs at the loop's next turn; taking the kept connection must not get there.
    turned = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(turned.set_result, True)
    async with ledger.connection("probe"):
        assert not turned.done()
    assert not turned.done()  # nor giving it back
    await turned


async def test_a_transaction_left_open_does_not_reach_the_next_operation(ledger: Ledger) -> None:
    async with ledger.connection("probe") as conn:
        await conn.execute("BEGIN")
        await conn.execute("CREATE TEMP TABLE left_open (n int)")
    assert ledger._connections.idle_count() == 0  # back to asyncpg, which rolled it back
    await _settled(ledger._pool)
    async with ledger.connection("probe") as conn:
        assert not conn.is_in_transaction()
        assert await conn.fetchval("SELECT to_regclass('pg_temp.left_open')") is None


async def test_a_cancelled_statement_leaves_a_usable_connection(ledger: Ledger) -> None:
    async def slow() -> None:
        async with ledger.connection("probe") as conn:
            await conn.execute("SELECT pg_sleep(30)")

    task = asyncio.create_task(slow())
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ledger._connections.idle_count() == 0  # asyncpg's pool waits for the cancellation
    async with ledger.connection("probe") as conn:  # never "another operation is in progress"
        assert await conn.fetchval("SELECT 1") == 1


async def test_an_operation_that_raises_gives_its_connection_back_to_the_pool(ledger: Ledger) -> None:
    with pytest.raises(asyncpg.UndefinedTableError):
        async with ledger.connection("probe") as conn:
            await conn.execute("SELECT * FROM no_such_table")
    assert ledger._connections.idle_count() == 0
    await _settled(ledger._pool)
    assert ledger._pool.get_idle_size() == 1


async def test_an_operation_waiting_on_the_pool_gets_the_connection_the_others_give_back(
    database_url: str,
) -> None:
    ledger = await Ledger.connect(database_url, min_size=1, max_size=1)
    try:
        # Each holds the only connection for a while; the others wait in asyncpg's pool meanwhile.
        async def hold(n: int) -> int:
            async with ledger.connection("probe") as conn:
                await asyncio.sleep(0.01)
                return int(await conn.fetchval("SELECT $1::int", n))

        answers = await asyncio.wait_for(asyncio.gather(*(hold(n) for n in range(8))), timeout=10)
        assert answers == list(range(8))
        assert await _backend(ledger) > 0  # and once nobody waits, it is kept again
        assert ledger._connections.idle_count() == 1
    finally:
        await ledger.close()


async def test_a_connection_unused_for_a_while_goes_back_to_the_pool(ledger: Ledger) -> None:
    ledger._connections.keep_idle_seconds = 0.05
    await _backend(ledger)
    assert ledger._connections.idle_count() == 1

    async def given_back() -> bool:
        return ledger._connections.idle_count() == 0

    await eventually(given_back, "the unused connection to go back", timeout=2, every=0.01)
    await _settled(ledger._pool)
    assert ledger._pool.get_idle_size() == 1  # asyncpg's own inactivity timer closes it from here


async def test_a_kept_connection_whose_backend_died_is_not_handed_out_again(
    ledger: Ledger, database_url: str
) -> None:
    backend = await _backend(ledger)
    killer = await asyncpg.connect(database_url)
    try:
        assert await killer.fetchval("SELECT pg_terminate_backend($1)", backend)

        async def noticed() -> bool:  # the client sees the socket close on a later turn of the loop
            return not still_open(ledger._connections._idle[0][0])

        await eventually(noticed, f"backend {backend}'s end to reach the client", timeout=5, every=0.01)
        assert await _backend(ledger) != backend
    finally:
        await killer.close()


async def test_a_statement_on_a_connection_killed_unnoticed_is_unavailable_then_the_next_one_works(
    ledger: Ledger, database_url: str
) -> None:
    """The backend is gone but the client has not read the socket's end yet: the statement fails as
    the ledger being away (nothing ran), and the dead connection is not kept."""
    backend = await _backend(ledger)
    killer = await asyncpg.connect(database_url)
    try:
        transport = ledger._connections._idle[0][0]._con._transport
        transport.pause_reading()  # the client reads nothing more: the end stays unnoticed
        assert await killer.fetchval("SELECT pg_terminate_backend($1)", backend)
        await asyncio.sleep(0.2)
        assert still_open(ledger._connections._idle[0][0])
        transport.resume_reading()
        with pytest.raises(LedgerUnavailableError):
            async with ledger.connection("probe") as conn:
                await conn.fetchval("SELECT 1")
        assert await _backend(ledger) != backend
    finally:
        await killer.close()


async def test_close_gives_back_and_closes_every_connection(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = await Ledger.connect(database_url)
    with caplog.at_level(logging.WARNING, logger="onceflow.ledger"):
        await asyncio.gather(*(_backend(ledger) for _ in range(3)))
        assert ledger._connections.idle_count() >= 1
        await ledger.close()
        await asyncio.sleep(0.05)  # a release left behind would now meet a closed pool, and fail
    assert ledger._pool.get_size() == 0
    assert ledger._connections.idle_count() == 0
    assert _release_failures(caplog) == []


async def test_a_release_that_raises_is_logged(
    ledger: Ledger, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    other = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
    try:
        conn = await other.acquire()
        with caplog.at_level(logging.WARNING, logger="onceflow.ledger"):
            # Not a connection of the ledger's pool: asyncpg's release refuses it (InterfaceError).
            release_later(ledger._pool, conn)

            async def logged() -> bool:
                return bool(_release_failures(caplog))

            await eventually(logged, "the failed release to be logged", timeout=1, every=0.01)
        assert "is not a member of this pool" in _release_failures(caplog)[0]
        await other.release(conn)
    finally:
        await other.close()
