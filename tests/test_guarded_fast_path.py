"""The guarded reservation's fast path (migration 0018) writes what the whole decision would have.

`onceflow_guarded_reserve` inserts a call with nothing in its way itself, and hands every other call
to `onceflow_guarded_decide` (0017's function, renamed). These tests hold the fast path to two
things: a call it inserts is, column for column and event for event, what the decision writes for the
same call; and a call with anything in its way (a twin, a busy entity, a spent budget, a replaced
call, its own recorded row) is never inserted by it, but decided by the whole function. Which of
the two ran is read from PostgreSQL's own count of the decision's calls in the transaction.

Real parts: a fresh PostgreSQL ledger; the functions called as ledger/guarded.py calls them.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

import asyncpg
import pytest

from onceflow.ledger import Guard, Ledger, SideEffect, queries
from onceflow.ledger.canonical import canonical_payload
from onceflow.ledger.guarded import statement_values

TOOL = "issue_credit"
# Columns that name the call or the moment, not what was decided.
_NAMING = {"key", "run_id", "tool_call_id", "created_at", "updated_at", "lease_expires_at"}


def _statement(function: str) -> str:
    return queries.GUARDED_RESERVE.replace("onceflow_guarded_reserve(", f"{function}(")


async def _reserve(
    conn: asyncpg.Connection,
    function: str,
    guard: Guard,
    *,
    run_id: str | None = None,
    tool_call_id: str = "call_1",
    arguments: dict[str, Any] | None = None,
    approval: bool = False,
) -> tuple[asyncpg.Record, int]:
    """Call `function` with the values `Ledger.reserve` would send; returns its answer and how many
    times the whole decision (onceflow_guarded_decide) ran for it."""
    run_id = run_id or f"run-{uuid.uuid4().hex[:8]}"
    values = statement_values(
        key=f"{run_id}:{tool_call_id}",
        tenant="t1",
        run_id=run_id,
        tool_call_id=tool_call_id,
        agent="billing",
        tool_name=TOOL,
        side_effect=SideEffect.EXTERNAL,
        payload=canonical_payload(TOOL, arguments or {"account_id": "acct_1", "amount_cents": 2500}),
        owner="worker-a",
        approval=approval,
        lease=timedelta(seconds=40),
        guard=guard,
    )
    async with conn.transaction():
        await conn.execute("SET LOCAL track_functions = 'pl'")
        row = await conn.fetchrow(_statement(function), *values)
        decided = await conn.fetchval(
            "SELECT coalesce(pg_stat_get_xact_function_calls('onceflow_guarded_decide'::regproc), 0)"
        )
    assert row is not None
    return row, int(decided)


async def _written(conn: asyncpg.Connection, row: asyncpg.Record) -> tuple[dict[str, Any], list[Any]]:
    """The call's row without its naming columns, and its events as (actor, kind, source, from, to,
    reason, detail)."""
    record = await conn.fetchrow("SELECT * FROM tool_executions WHERE key = $1", row["key"])
    assert record is not None
    events = await conn.fetch(
        "SELECT actor, kind, source, from_status, to_status, reason, detail "
        "FROM tool_execution_events WHERE key = $1 ORDER BY id",
        row["key"],
    )
    return {k: v for k, v in record.items() if k not in _NAMING}, [tuple(e) for e in events]


@pytest.fixture
async def conn(ledger: Ledger, database_url: str) -> Any:
    connection = await asyncpg.connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


NOTHING_IN_THE_WAY = {
    "default intent guard": (Guard(toolset="billing"), False),
    "intent allow": (Guard(intent="allow", toolset="billing"), False),
    "intent reuse": (Guard(intent="reuse", toolset="billing"), False),
    "awaiting approval": (Guard(toolset="billing"), True),
    "exclusive entity": (Guard(entity="ord_1", exclusive=True, toolset="billing"), False),
    "entity and budget": (
        Guard(
            entity="ord_1",
            exclusive=True,
            amount=Decimal("25.00"),
            limit=Decimal("100"),
            toolset="billing",
            currency="EUR",
        ),
        False,
    ),
    "budget, not exclusive": (
        Guard(entity="ord_1", amount=Decimal(25), limit=Decimal(100), toolset="billing"),
        False,
    ),
}


@pytest.mark.parametrize("shape", NOTHING_IN_THE_WAY)
async def test_a_call_with_nothing_in_its_way_is_written_as_the_decision_writes_it(
    conn: asyncpg.Connection, shape: str
) -> None:
    guard, approval = NOTHING_IN_THE_WAY[shape]
    # Two tenants' worth of room: each call is the first of its run, entity and budget key.
    fast, fast_decided = await _reserve(conn, "onceflow_guarded_reserve", guard, approval=approval)
    other = guard.model_copy(update={"entity": "ord_2"}) if guard.entity else guard
    whole, _ = await _reserve(conn, "onceflow_guarded_decide", other, approval=approval)

    assert fast_decided == 0, "the fast path handed a call with nothing in its way to the decision"
    assert [fast[c] for c in ("outcome", "action", "previous_status", "previous_updated_at")] == [
        whole[c] for c in ("outcome", "action", "previous_status", "previous_updated_at")
    ]
    fast_row, fast_events = await _written(conn, fast)
    whole_row, whole_events = await _written(conn, whole)
    if guard.entity:
        assert (fast_row.pop("entity"), whole_row.pop("entity")) == ("ord_1", "ord_2")
    assert fast_row == whole_row
    assert fast_events == whole_events
    lease = await conn.fetchval("SELECT lease_expires_at FROM tool_executions WHERE key = $1", fast["key"])
    assert (lease is None) == approval


async def test_a_twin_is_decided_by_the_whole_function(conn: asyncpg.Connection) -> None:
    run = f"run-{uuid.uuid4().hex[:8]}"
    await _reserve(conn, "onceflow_guarded_reserve", Guard(), run_id=run, tool_call_id="call_1")
    twin, decided = await _reserve(
        conn, "onceflow_guarded_reserve", Guard(), run_id=run, tool_call_id="call_2"
    )
    assert decided == 1
    assert (twin["outcome"], twin["status"], twin["held_by"]) == ("held", "held", f"{run}:call_1")


async def test_a_twin_under_intent_allow_goes_the_fast_way(conn: asyncpg.Connection) -> None:
    run = f"run-{uuid.uuid4().hex[:8]}"
    allow = Guard(intent="allow")
    await _reserve(conn, "onceflow_guarded_reserve", allow, run_id=run, tool_call_id="call_1")
    twin, decided = await _reserve(conn, "onceflow_guarded_reserve", allow, run_id=run, tool_call_id="call_2")
    assert (twin["outcome"], decided) == ("new", 0)


async def test_a_busy_entity_is_decided_by_the_whole_function(conn: asyncpg.Connection) -> None:
    busy = Guard(entity="ord_9", exclusive=True)
    await _reserve(conn, "onceflow_guarded_reserve", busy)
    second, decided = await _reserve(conn, "onceflow_guarded_reserve", busy)
    assert decided == 1
    assert second["outcome"] == "held"


async def test_a_spent_budget_is_decided_by_the_whole_function(conn: asyncpg.Connection) -> None:
    def draw(amount: int) -> Guard:
        return Guard(entity="ord_7", amount=Decimal(amount), limit=Decimal(100))

    first, _ = await _reserve(conn, "onceflow_guarded_reserve", draw(60))
    assert first["outcome"] == "new"
    at_the_limit, decided = await _reserve(conn, "onceflow_guarded_reserve", draw(40))
    assert (at_the_limit["outcome"], decided) == ("new", 0)  # 60 + 40 is the limit, not over it
    over, decided = await _reserve(conn, "onceflow_guarded_reserve", draw(1))
    assert decided == 1
    assert (over["outcome"], over["failure_kind"]) == ("refused", "guard_refused")
    assert "would exceed the limit of 100" in over["reason"]


async def test_a_replacement_is_decided_by_the_whole_function(conn: asyncpg.Connection) -> None:
    run = f"run-{uuid.uuid4().hex[:8]}"
    await _reserve(conn, "onceflow_guarded_reserve", Guard(), run_id=run, tool_call_id="call_1")
    replacement, decided = await _reserve(
        conn,
        "onceflow_guarded_reserve",
        Guard(replaces=f"{run}:call_1"),
        run_id=run,
        tool_call_id="call_2",
        arguments={"account_id": "acct_1", "amount_cents": 900},
    )
    assert decided == 1
    assert replacement["outcome"] == "refused"  # the call it replaces is still started


async def test_a_recorded_key_is_decided_by_the_whole_function(conn: asyncpg.Connection) -> None:
    run = f"run-{uuid.uuid4().hex[:8]}"
    await _reserve(conn, "onceflow_guarded_reserve", Guard(intent="allow"), run_id=run)
    again, decided = await _reserve(conn, "onceflow_guarded_reserve", Guard(intent="allow"), run_id=run)
    assert decided == 1
    assert again["outcome"] == "in_flight"
