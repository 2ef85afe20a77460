"""A held call whose blocker settles while the held reservation is being decided.

A settle wakes the calls held behind it by looking them up after its commit, and only when its row
says some call was held behind it (`holds_calls`, written by the reservation that holds one, under
the blocker's row lock: migration 0015). The two orders a settle and a held reservation can meet
in are made to happen for certain, with a second session holding a lock at the right moment:

- the settle commits first: the reservation, which decided "hold" on what it read before, finds
  the blocker settled when it goes to mark it, and decides again in the same write activity;
- the reservation marks the blocker first: the settle waits for the reservation's commit, its
  row says a call is held behind it, and its wake-up finds that call and signals its run.

(Before the mark, the first order left the call held until its run's backoff timer, or needed a
second look at the blocker after every held reservation; the second read the held calls on every
settle, one round trip per write call.)

Real parts: the session's Temporal dev server, a fresh PostgreSQL ledger (two sessions on it), an
in-process worker, and the in-process downstream that counts effects per key.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal

import asyncpg
import pytest
from temporalio.testing import WorkflowEnvironment

from onceflow.activities.held import wake_held
from onceflow.ledger import CallIdentity, EventSource, Ledger, Status, ToolExecutionRecord
from tests.support.agents import support_registry
from tests.support.downstream import DOWNSTREAM, toolset
from tests.support.history import activity_runs, history_events
from tests.support.waiting import eventually, until_waiting
from tests.workflow_harness import Harness, running_worker


@pytest.fixture
async def harness(temporal_env: WorkflowEnvironment, ledger: Ledger) -> AsyncIterator[Harness]:
    DOWNSTREAM.reset()
    async with running_worker(temporal_env.client, ledger, support_registry()) as running:
        yield running


async def unknown_refund(ledger: Ledger, order_id: str) -> str:
    """A refund of the order whose outcome is unknown: it keeps the order busy."""
    tool = toolset.get("refund_order")
    arguments = {"order_id": order_id, "amount_cents": 100}
    call = CallIdentity(tenant="acme", run_id=f"run-{uuid.uuid4().hex[:10]}", tool_call_id="call_1_0")
    await ledger.reserve(
        call,
        tool_name=tool.name,
        side_effect=tool.side_effect,
        arguments=arguments,
        owner="worker-gone",
        guard=tool.ledger_guard(arguments, limit=Decimal(1250)),
    )
    await ledger.mark_indeterminate(call.key, actor="worker-gone", reason="no answer within 1s")
    return call.key


def settle_as_not_applied(ledger: Ledger, key: str) -> asyncio.Task[ToolExecutionRecord]:
    return asyncio.create_task(
        ledger.settle(
            key,
            status=Status.FAILED,
            actor="operator:ann",
            reason="no refund in the payment system",
            evidence={"checked": "payments console"},
            source=EventSource.API,
        )
    )


async def write_activities(harness: Harness, run: str) -> int:
    runs = activity_runs(await history_events(harness.client, run))
    return sum(1 for r in runs if r.activity_type == "run_write_tool")


async def test_a_blocker_settled_first_makes_the_held_reservation_decide_again_at_once(
    harness: Harness, ledger: Ledger, database_url: str
) -> None:
    order_id = f"o{uuid.uuid4().hex[:8]}"
    blocker = await unknown_refund(ledger, order_id)
    run = f"run-{uuid.uuid4().hex[:10]}"
    held = f"{run}:call_1_0"
    gate = await asyncpg.connect(database_url)
    try:
        # The order's budget row, locked: the settle, which releases the blocker's amount there,
        # stops after its update of the blocker's row (locked, not committed).
        tx = gate.transaction()
        await tx.start()
        await gate.execute("SELECT 1 FROM budget_totals WHERE entity = $1 FOR UPDATE", order_id)
        settling = settle_as_not_applied(ledger, blocker)
        await until_waiting(gate, 1, "the settle to wait at the order's budget row")
        # The refund's reservation reads the blocker as unknown, decides to hold the call behind
        # it, and waits for the settle to mark the blocker.
        handle = await harness.start("refund", json.dumps({"order_id": order_id}), run_id=run)
        await until_waiting(gate, 2, "the held reservation to wait at the blocker's row")
        await tx.rollback()
        released_at = time.monotonic()
    finally:
        await gate.close()
    settled = await settling
    assert settled.status is Status.FAILED
    assert not settled.holds_calls  # the reservation marked nothing: it was decided again

    async def sent() -> bool:
        return DOWNSTREAM.effects[held] == 1

    await eventually(sent, "the refund to be sent")
    took = time.monotonic() - released_at
    await asyncio.wait_for(handle.result(), 30)
    record = await ledger.get(held)
    assert record.status is Status.COMPLETED
    assert [e.kind for e in record.events][:1] == ["reserved"]  # never held
    assert await write_activities(harness, run) == 1
    assert took < 1.0, f"the refund was sent {took:.2f}s after its blocker settled"


async def test_a_held_reservation_that_marked_the_blocker_first_is_woken_by_its_settle(
    harness: Harness, ledger: Ledger, database_url: str
) -> None:
    order_id = f"o{uuid.uuid4().hex[:8]}"
    blocker = await unknown_refund(ledger, order_id)
    run = f"run-{uuid.uuid4().hex[:10]}"
    held = f"{run}:call_1_0"
    gate = await asyncpg.connect(database_url)
    try:
        # A row under the held call's key, not committed: the reservation sees no row, decides to
        # hold, marks the blocker, and waits at its INSERT for this session to end.
        tx = gate.transaction()
        await tx.start()
        await gate.execute(
            "INSERT INTO tool_executions (key, tenant, run_id, tool_call_id, tool_name, side_effect, "
            "status, payload, payload_sha256) VALUES ($1, 'acme', $2, 'call_1_0', 'refund_order', "
            "'external', 'started', '{}', repeat('0', 64))",
            held,
            run,
        )
        handle = await harness.start("refund", json.dumps({"order_id": order_id}), run_id=run)
        await until_waiting(gate, 1, "the held call's reservation to wait at its write")
        # The settle waits for the reservation that marked the blocker to commit.
        settling = settle_as_not_applied(ledger, blocker)
        await until_waiting(gate, 2, "the settle to wait at the blocker's row")
        await tx.rollback()
    finally:
        await gate.close()
    settled = await settling
    released_at = time.monotonic()
    assert settled.holds_calls
    assert await wake_held(ledger, settled, harness.client) == 1

    async def sent() -> bool:
        return DOWNSTREAM.effects[held] == 1

    await eventually(sent, "the held call to be sent")
    took = time.monotonic() - released_at
    await asyncio.wait_for(handle.result(), 30)
    record = await ledger.get(held)
    assert record.status is Status.COMPLETED
    assert [e.kind for e in record.events][:2] == ["held", "reserved"]
    assert await write_activities(harness, run) == 2  # held, then sent once woken
    assert took < 1.0, f"the held call was sent {took:.2f}s after its blocker's wake-up"


async def test_a_settled_call_nobody_was_held_behind_wakes_without_a_read(
    ledger: Ledger, database_url: str
) -> None:
    order_id = f"o{uuid.uuid4().hex[:8]}"
    blocker = await unknown_refund(ledger, order_id)
    settled = await settle_as_not_applied(ledger, blocker)
    assert settled.status is Status.FAILED and not settled.holds_calls
    closed = await Ledger.connect(database_url)
    await closed.close()  # any read through it would fail
    assert await wake_held(closed, settled) == 0
