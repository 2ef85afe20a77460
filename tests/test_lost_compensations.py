"""A compensation whose record a failover of the ledger may have lost is never sent again.

The compensation is a write of its own (`<key>:compensation`), so what holds for a write call's lost
record holds for it (tests/test_lost_attempts.py, ledger/lost_writes.py): under asynchronous
replication "no row" no longer proves "not sent". Two ways it shows:

- the compensation activity was lost and the ledger has no row: the workflow runs it again, telling
  it when the lost attempt began (`CompensationInput.lost_attempt_at`); if the ledger failed over
  since, the fresh reservation becomes an unknown call and the hook is not run;
- the hook ran and the row is gone when its outcome is written (the old primary took it along): the
  row is written back as an unknown call at the attempt that sent it, never reported "not found" (a
  run that read that as "nothing was reserved" would run the hook again).

A reservation that committed while its answer was lost is released by the next attempt, told the
lost one's owner token, and the hook runs once. What the workflow does when an attempt fails is
tests/test_compensation_attempts.py. Each test's record is its own hook's list of what it undid.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from temporalio.exceptions import ApplicationError

from onceflow import ToolContext, Toolset, external
from onceflow.activities.compensation import CompensationActivities, compensation_key
from onceflow.ledger import CallIdentity, Ledger, SideEffect, Status, ToolExecutionRecord
from onceflow.ledger.lost_writes import LOST_KIND
from onceflow.runtime.agents import Agent, AgentConfig, AgentRegistry
from onceflow.runtime.constants import (
    ERR_OUTCOME_NOT_RECORDED,
)
from onceflow.sdk.payloads import (
    CompensationInput,
    OwnerOutcome,
)
from tests.support.lost_attempts import attempt_environment, failed_over_at
from tests.support.replication import fail_over, replicated_ledger

undo = Toolset("lost-compensations")
UNDONE: list[str] = []  # the compensation keys the hook was run with, in order
# Set by a test: run inside the hook, after it took effect (a failover losing the row, say).
AFTER_UNDO: list[Any] = []


async def refund(original: ToolExecutionRecord, context: ToolContext) -> dict[str, Any]:
    """Undo the payment, once, with the compensation's key."""
    UNDONE.append(context.idempotency_key)
    for then in AFTER_UNDO:
        await then(context.idempotency_key)
    return {"refunded": original.key}


@undo.tool(external(), compensation=refund)
async def pay(amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Pay once, with the call's key."""
    return {"paid": amount_cents}


def _registry() -> AgentRegistry:
    config = AgentConfig.model_validate(
        {"model": {"provider": "scripted", "script": [{"final": "-"}]}, "toolsets": ["lost-compensations"]}
    )
    return AgentRegistry({"payer": Agent("payer", config, {t.name: t for t in undo.tools})})


async def _completed_payment(ledger: Ledger) -> CompensationInput:
    """A completed call of `pay`, as the run that made it left it; the compensation's input for it."""
    call = CallIdentity(
        tenant="t1", run_id=f"run-{uuid.uuid4().hex[:10]}", tool_call_id="call_1", agent="payer"
    )
    owner = "wf/1#1@worker-a"
    reserved = await ledger.reserve(
        call, tool_name="pay", side_effect=SideEffect.EXTERNAL, arguments={"amount_cents": 700}, owner=owner
    )
    assert reserved.may_send
    await ledger.complete(call.key, owner=owner, result={"paid": 700})
    return CompensationInput(key=call.key, tenant="t1", actor="operator:ana", reason="paid twice by hand")


async def test_a_lost_compensation_before_a_failover_is_unknown_and_not_run_again(
    ledger: Ledger, database_url: str
) -> None:
    request = await _completed_payment(ledger)
    now = datetime.now(UTC)
    await failed_over_at(database_url, now)
    UNDONE.clear()
    activities = CompensationActivities(ledger, _registry(), "worker-c")
    again = request.model_copy(update={"lost_attempt_at": now - timedelta(minutes=3)})
    outcome = await attempt_environment().run(activities.run_compensation, again)
    assert UNDONE == []  # the hook was not run again
    assert outcome.status is Status.INDETERMINATE
    record = await ledger.get(compensation_key(request.key))
    assert record.status is Status.INDETERMINATE
    assert record.events[-1].kind == LOST_KIND
    assert (await ledger.get(request.key)).status is Status.COMPLETED  # nothing marked undone


async def test_a_lost_compensation_after_the_failover_runs_as_before(
    ledger: Ledger, database_url: str
) -> None:
    """The lost attempt began after the switch: its reservation was on the new primary, so "no row"
    means nothing was reserved, and the hook runs."""
    request = await _completed_payment(ledger)
    now = datetime.now(UTC)
    await failed_over_at(database_url, now - timedelta(minutes=10))
    UNDONE.clear()
    activities = CompensationActivities(ledger, _registry(), "worker-c")
    again = request.model_copy(update={"lost_attempt_at": now - timedelta(minutes=1)})
    outcome = await attempt_environment().run(activities.run_compensation, again)
    assert UNDONE == [compensation_key(request.key)]
    assert outcome.status is Status.COMPLETED


async def test_a_compensation_whose_row_a_failover_took_is_written_back_unknown(
    ledger: Ledger, database_url: str
) -> None:
    """The hook took effect; meanwhile the ledger failed over and the new primary never had the
    compensation's reservation. Its outcome is not "record not found" but an unknown call at the
    attempt that sent it, which an operator settles, and the hook is not run again."""
    request = await _completed_payment(ledger)

    async def lost_with_the_old_primary(key: str) -> None:
        conn = await asyncpg.connect(database_url)
        try:  # as a promoted standby that never received the rows: no trigger sees it
            await conn.execute("SET session_replication_role = replica")
            await conn.execute("DELETE FROM tool_execution_events WHERE key = $1", key)
            await conn.execute("DELETE FROM tool_executions WHERE key = $1", key)
        finally:
            await conn.close()

    UNDONE.clear()
    AFTER_UNDO[:] = [lost_with_the_old_primary]
    try:
        activities = CompensationActivities(ledger, _registry(), "worker-c")
        outcome = await attempt_environment().run(activities.run_compensation, request)
    finally:
        AFTER_UNDO.clear()
    assert UNDONE == [compensation_key(request.key)]
    assert outcome.status is Status.INDETERMINATE
    record = await ledger.get(compensation_key(request.key))
    assert record.status is Status.INDETERMINATE
    assert record.events[-1].kind == LOST_KIND
    assert record.events[-1].detail["reported"]["status"] == "completed"  # what the owner knows


async def test_a_compensation_whose_outcome_cannot_be_written_hands_it_to_the_workflow(
    database_url: str,
) -> None:
    """The hook ran; the ledger is away when its outcome is written. The activity says so with the
    outcome (and the row it reserved) in hand, for the workflow to record with a retrying step."""
    setup = await Ledger.connect(database_url)
    try:
        request = await _completed_payment(setup)
    finally:
        await setup.close()
    worker_ledger = await Ledger.connect(database_url)

    async def ledger_gone(key: str) -> None:
        await worker_ledger.close()

    UNDONE.clear()
    AFTER_UNDO[:] = [ledger_gone]
    try:
        activities = CompensationActivities(worker_ledger, _registry(), "worker-c")
        with pytest.raises(ApplicationError) as raised:
            await attempt_environment().run(activities.run_compensation, request)
    finally:
        AFTER_UNDO.clear()
    assert UNDONE == [compensation_key(request.key)]
    assert raised.value.type == ERR_OUTCOME_NOT_RECORDED
    handed = OwnerOutcome.model_validate(raised.value.details[0])
    assert handed.status == "completed" and handed.value == {"refunded": request.key}
    assert handed.reserved is not None and handed.reserved.key == compensation_key(request.key)


async def test_a_compensation_lost_in_a_real_failover_after_its_worker_died_is_not_run_again() -> None:
    """A primary and an asynchronous standby. The compensation is reserved and its hook runs; the
    worker dies (its memory of what it wrote goes with it) and the primary is killed before the
    reservation reached the standby. The run finds no row and asks again, telling when the lost
    attempt began: the promoted ledger's timeline switch is after it, so nothing is run."""
    async with replicated_ledger(synchronous=False) as (pair, dsn):
        first = await Ledger.connect(dsn, process="worker-a")
        try:
            request = await _completed_payment(first)  # replicated before the hold
            began = datetime.now(UTC)
            pair.hold_replication()
            UNDONE.clear()
            activities = CompensationActivities(first, _registry(), "worker-a")
            done = await attempt_environment().run(activities.run_compensation, request)
            assert done.status is Status.COMPLETED and UNDONE == [compensation_key(request.key)]
        finally:
            await first.close()  # the worker dies with its journal of acknowledged writes
        fail_over(pair, lose_recent_writes=True)
        second = await Ledger.connect(dsn, process="worker-b")
        try:
            assert await second.find(compensation_key(request.key)) is None  # "no row"
            again = request.model_copy(update={"lost_attempt_at": began})
            activities = CompensationActivities(second, _registry(), "worker-b")
            outcome = await attempt_environment().run(activities.run_compensation, again)
            assert outcome.status is Status.INDETERMINATE
            assert UNDONE == [compensation_key(request.key)]  # run once, never again
            record = await second.get(compensation_key(request.key))
            assert record.status is Status.INDETERMINATE and record.events[-1].kind == LOST_KIND
        finally:
            await second.close()


async def test_a_compensation_reserved_by_an_attempt_that_sent_nothing_is_released_and_run_once(
    ledger: Ledger,
) -> None:
    """The earlier attempt's reservation committed, its answer lost: the row is `started` under its
    owner token. The next attempt, told that token, releases it as not attempted and runs the hook."""
    request = await _completed_payment(ledger)
    original = await ledger.get(request.key)
    lost_owner = "compensation:run-x/1#1@worker-a"
    await ledger.reserve(
        CallIdentity(
            tenant=original.tenant,
            run_id=original.run_id,
            tool_call_id=original.tool_call_id + ":compensation",
            agent=original.agent,
        ),
        tool_name="refund",
        side_effect=SideEffect.EXTERNAL,
        arguments={"compensates": original.key},
        owner=lost_owner,
        lease=timedelta(seconds=35),
    )
    UNDONE.clear()
    activities = CompensationActivities(ledger, _registry(), "worker-b")
    again = request.model_copy(update={"unsent_owners": [lost_owner]})
    outcome = await attempt_environment().run(activities.run_compensation, again)
    assert UNDONE == [compensation_key(request.key)]
    assert outcome.status is Status.COMPLETED
    record = await ledger.get(compensation_key(request.key))
    assert record.attempt == 2 and record.owner != lost_owner
    released = [e for e in record.events if e.kind == "failed" and e.to_status is Status.FAILED]
    assert len(released) == 1 and "nothing was sent" in (released[0].reason or "")
