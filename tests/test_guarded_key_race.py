"""Another writer on the same key while a guarded reservation is being decided (migration 0016).

The guarded reservation reads the call's row, if any, without locking it, decides, and then writes
only over what it read: an INSERT for a key nobody had recorded, an UPDATE of the row version it
read. Anything else is decided again. Each test holds the other writer's transaction open on a
second session, so that the reservation reads before that writer commits and writes after, for
certain.

Before 0016 the first two were double sends. With no advisory lock in common (a guard with intent
`allow` and no entity, or two payloads under one key), both reservations found no row, and the
second's INSERT ... ON CONFLICT DO UPDATE took the first one's row over: both were told `new`.

Real parts: a fresh PostgreSQL ledger and a second session on it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from onceflow.ledger import (
    CallIdentity,
    FailureKind,
    Guard,
    Ledger,
    PayloadMismatchError,
    Reservation,
    ReserveResult,
    SideEffect,
    Status,
    queries,
)
from onceflow.ledger.canonical import canonical_payload
from onceflow.ledger.guarded import statement_values
from tests.support.waiting import until_waiting

TOOL = "issue_credit"
CREDIT = {"account_id": "acct_1", "amount_cents": 2500}


@pytest.fixture
async def other_writer(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(database_url)
    try:
        yield conn
    finally:
        await conn.close()


def new_call() -> CallIdentity:
    return CallIdentity(tenant="t1", run_id=f"run-{uuid.uuid4().hex[:8]}", tool_call_id="call_1")


def reserving(
    ledger: Ledger, call: CallIdentity, guard: Guard, arguments: dict[str, Any] = CREDIT
) -> asyncio.Task[ReserveResult]:
    return asyncio.create_task(
        ledger.reserve(
            call,
            tool_name=TOOL,
            side_effect=SideEffect.EXTERNAL,
            arguments=arguments,
            owner="worker-b",
            guard=guard,
        )
    )


async def reserve_uncommitted(
    conn: asyncpg.Connection, call: CallIdentity, guard: Guard, arguments: dict[str, Any] = CREDIT
) -> None:
    """Worker A's reservation: the statement `Ledger.reserve` sends, inside a transaction left open."""
    values = statement_values(
        key=call.key,
        tenant=call.tenant,
        run_id=call.run_id,
        tool_call_id=call.tool_call_id,
        agent=call.agent,
        tool_name=TOOL,
        side_effect=SideEffect.EXTERNAL,
        payload=canonical_payload(TOOL, arguments),
        owner="worker-a",
        approval=False,
        lease=None,
        guard=guard,
    )
    await conn.execute("BEGIN")
    row = await conn.fetchrow(queries.GUARDED_RESERVE, *values)
    assert row is not None and row["outcome"] == "new"


async def test_a_key_recorded_while_it_was_decided_is_not_taken_over(
    ledger: Ledger, other_writer: asyncpg.Connection
) -> None:
    """Intent `allow` takes no advisory lock, so nothing but the key itself keeps two workers apart."""
    call, guard = new_call(), Guard(intent="allow")
    await reserve_uncommitted(other_writer, call, guard)
    second = reserving(ledger, call, guard)
    await until_waiting(other_writer, 1, "the second reservation to wait at the key")
    await other_writer.execute("COMMIT")

    result = await asyncio.wait_for(second, 30)
    assert result.outcome is Reservation.IN_FLIGHT, "the second worker was told to send as well"
    assert result.record.owner == "worker-a"
    record = await ledger.get(call.key)
    assert [e.kind for e in record.events].count("reserved") == 1


async def test_another_payload_under_a_key_recorded_meanwhile_is_refused(
    ledger: Ledger, other_writer: asyncpg.Connection
) -> None:
    """Two payloads take two different intent locks: the key is all they share."""
    call, guard = new_call(), Guard()
    await reserve_uncommitted(other_writer, call, guard)
    second = reserving(ledger, call, guard, {"account_id": "acct_1", "amount_cents": 9900})
    await until_waiting(other_writer, 1, "the second reservation to wait at the key")
    await other_writer.execute("COMMIT")

    with pytest.raises(PayloadMismatchError):
        await asyncio.wait_for(second, 30)
    record = await ledger.get(call.key)
    assert (record.owner, record.payload["arguments"]) == ("worker-a", CREDIT)


async def test_a_recorded_call_changed_after_it_was_read_is_decided_again(
    ledger: Ledger, other_writer: asyncpg.Connection
) -> None:
    """A retry reads the call failed without effect; before it writes, another writer makes that
    final. The retry must answer with the final row, not write its reservation over it."""
    call, guard = new_call(), Guard()
    first = await ledger.reserve(
        call, tool_name=TOOL, side_effect=SideEffect.EXTERNAL, arguments=CREDIT, owner="worker-a", guard=guard
    )
    await ledger.fail(
        first.record.key, owner="worker-a", kind=FailureKind.NOT_APPLIED, error="no such account"
    )
    await other_writer.execute("BEGIN")
    await other_writer.execute(
        "UPDATE tool_executions SET failure_kind = 'released', updated_at = clock_timestamp() WHERE key = $1",
        call.key,
    )
    retry = reserving(ledger, call, guard)
    await until_waiting(other_writer, 1, "the retry to wait at the call's row")
    await other_writer.execute("COMMIT")

    result = await asyncio.wait_for(retry, 30)
    assert result.outcome is Reservation.SETTLED, "the retry wrote over a row it had not read"
    assert (result.record.status, result.record.failure_kind) == (Status.FAILED, FailureKind.RELEASED)
    assert result.record.attempt == 1
