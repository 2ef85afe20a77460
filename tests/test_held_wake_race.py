"""A held call whose blocker settles while the held reservation is still being written.

The settler wakes the calls held behind it by looking them up after its own commit; a reservation
that decided "hold" before that commit, but committed its `held` row after the look-up, is not
found, and used to wait for its run's backoff timer. The test makes that interleaving happen for
certain: an uncommitted row under the held call's key (a second session) stops the reservation
right after its decision, at its write; the blocker is settled and its wake-up runs; then the row
is rolled back and the reservation commits.

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
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from onceflow.activities.held import wake_held
from onceflow.ledger import CallIdentity, EventSource, Ledger, Status
from tests.support.agents import support_registry
from tests.support.downstream import DOWNSTREAM, toolset
from tests.support.history import history_events
from tests.support.waiting import eventually
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


async def waiting_on_a_lock(conn: asyncpg.Connection) -> bool:
    waiting = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
    )
    return bool(waiting)


async def test_a_held_call_whose_blocker_settles_concurrently_is_woken_within_a_second(
    harness: Harness, ledger: Ledger, database_url: str
) -> None:
    order_id = f"o{uuid.uuid4().hex[:8]}"
    blocker = await unknown_refund(ledger, order_id)
    run = f"run-{uuid.uuid4().hex[:10]}"
    held = f"{run}:call_1_0"
    gate = await asyncpg.connect(database_url)
    try:
        # A row under the held call's key, not committed: the reservation sees no row, decides to
        # hold (the blocker is unknown), and then waits at its INSERT for this session to end.
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

        async def blocked() -> bool:
            return await waiting_on_a_lock(gate)

        await eventually(blocked, "the held call's reservation to wait at its write")
        # The blocker settles and wakes what it finds held behind it: nothing yet.
        settled = await ledger.settle(
            blocker,
            status=Status.FAILED,
            actor="operator:ann",
            reason="no refund in the payment system",
            evidence={"checked": "payments console"},
            source=EventSource.API,
        )
        assert await wake_held(ledger, settled, harness.client) == 0
        await tx.rollback()
        released_at = time.monotonic()
    finally:
        await gate.close()

    async def sent() -> bool:
        return DOWNSTREAM.effects[held] == 1

    await eventually(sent, "the held call to be sent")
    took = time.monotonic() - released_at
    await asyncio.wait_for(handle.result(), 30)

    record = await ledger.get(held)
    assert record.status is Status.COMPLETED
    assert [e.kind for e in record.events][:2] == ["held", "reserved"]
    # It went on in the same write activity, without waiting for the run's backoff timer.
    events = await history_events(harness.client, run)
    writes = [
        e
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "run_write_tool"
    ]
    assert len(writes) == 1
    assert took < 1.0, f"the held call was sent {took:.2f}s after its blocker settled"
