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

Each test's record is its own hook's list of what it undid, and the Temporal history of the run.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from temporalio import activity
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow import ToolContext, Toolset, external
from onceflow.activities.compensation import CompensationActivities, compensation_key
from onceflow.ledger import CallIdentity, Ledger, SideEffect, Status, ToolExecutionRecord
from onceflow.ledger.lost_writes import LOST_KIND
from onceflow.runtime.agents import Agent, AgentConfig, AgentRegistry
from onceflow.runtime.constants import (
    ERR_LEDGER_UNAVAILABLE,
    ERR_OUTCOME_NOT_RECORDED,
    RESERVE_BACKOFF_INITIAL,
)
from onceflow.sdk.payloads import (
    CallRef,
    CompensationInput,
    CompensationPlan,
    CompensationResult,
    OwnerOutcome,
    ToolOutcome,
)
from onceflow.workflows.compensation import CompensationWorkflow
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


# -- the workflow tells a second attempt when the lost one began ------------------------------------


async def _compensate(temporal_env: WorkflowEnvironment, activities: list[Any]) -> CompensationResult:
    """One CompensationWorkflow run on a worker of its own with these activities (test doubles
    under the real activities' names); its result, or an AssertionError saying why it failed."""
    queue = f"lost-compensations-{uuid.uuid4().hex[:8]}"
    request = CompensationInput(key="run-x:call_1", tenant="t1", actor="operator:ana", reason="twice")
    async with Worker(
        temporal_env.client, task_queue=queue, workflows=[CompensationWorkflow], activities=activities
    ):
        try:
            return await temporal_env.client.execute_workflow(
                CompensationWorkflow.run, request, id=f"compensation:{uuid.uuid4().hex}", task_queue=queue
            )
        except WorkflowFailureError as exc:  # pragma: no cover - the assertions say what failed
            raise AssertionError(f"the compensation run failed: {exc.cause}") from exc


ATTEMPTS: list[CompensationInput] = []
SCHEDULED: list[datetime] = []


@activity.defn(name="plan_compensation")
async def plan(request: CompensationInput) -> CompensationPlan:
    return CompensationPlan(
        compensation_key=compensation_key(request.key),
        hook="refund",
        timeout_seconds=5,
        recheck_interval_seconds=60,
    )


@activity.defn(name="run_compensation")
async def lost_once(request: CompensationInput) -> ToolOutcome:
    """The first attempt is lost without a trace; the second completes."""
    ATTEMPTS.append(request)
    SCHEDULED.append(activity.info().scheduled_time)
    if len(ATTEMPTS) == 1:
        raise ApplicationError("the worker died", non_retryable=True)
    return ToolOutcome(
        tool_call_id=compensation_key(request.key),
        tool="refund",
        key=compensation_key(request.key),
        status=Status.COMPLETED,
    )


@activity.defn(name="inspect_call")
async def no_row(ref: CallRef) -> ToolOutcome | None:
    return None


@activity.defn(name="finish_compensation")
async def finish(request: CompensationInput) -> ToolOutcome:
    return ToolOutcome(tool_call_id="call_1", tool="pay", key=request.key, status=Status.COMPENSATED)


async def test_a_compensation_run_again_after_no_row_is_told_when_the_lost_attempt_began(
    temporal_env: WorkflowEnvironment,
) -> None:
    ATTEMPTS.clear()
    SCHEDULED.clear()
    await _compensate(temporal_env, [plan, lost_once, no_row, finish])
    assert len(ATTEMPTS) == 2
    assert ATTEMPTS[0].lost_attempt_at is None
    lost_at = ATTEMPTS[1].lost_attempt_at
    assert lost_at is not None
    # The workflow's clock when it scheduled the first attempt: not after the server scheduled it.
    assert lost_at <= SCHEDULED[0] < SCHEDULED[1]
    assert SCHEDULED[0] - lost_at < timedelta(seconds=5)


RECORDED: list[OwnerOutcome] = []
INSPECTED: list[CallRef] = []


@activity.defn(name="run_compensation")
async def outcome_not_recorded(request: CompensationInput) -> ToolOutcome:
    """The hook ran and completed; the ledger was away when its outcome was written."""
    key = compensation_key(request.key)
    outcome = OwnerOutcome(
        key=key, owner="wf/1#1@w", tool="refund", tool_call_id=key, status="completed", value={"refunded": 1}
    )
    raise ApplicationError(
        "outcome not recorded",
        outcome.model_dump(mode="json"),
        type=ERR_OUTCOME_NOT_RECORDED,
        non_retryable=True,
    )


@activity.defn(name="record_outcome")
async def record(outcome: OwnerOutcome) -> ToolOutcome:
    RECORDED.append(outcome)
    return ToolOutcome(
        tool_call_id=outcome.tool_call_id, tool=outcome.tool, key=outcome.key, status=Status.COMPLETED
    )


@activity.defn(name="inspect_call")
async def inspect(ref: CallRef) -> ToolOutcome | None:
    INSPECTED.append(ref)
    return None


async def test_a_compensation_whose_outcome_was_not_written_is_recorded_not_looked_for(
    temporal_env: WorkflowEnvironment,
) -> None:
    RECORDED.clear()
    INSPECTED.clear()
    result = await _compensate(temporal_env, [plan, outcome_not_recorded, record, inspect, finish])
    assert result.status is Status.COMPLETED
    assert [r.value for r in RECORDED] == [{"refunded": 1}]
    assert INSPECTED == []  # nothing guessed from the ledger's rows


# -- a reservation whose answer was lost: nothing was sent, and the next attempt knows it ------------

REQUESTS: list[CompensationInput] = []
SLEPT: list[datetime] = []


@activity.defn(name="run_compensation")
async def answer_lost_once(request: CompensationInput) -> ToolOutcome:
    """The first attempt's reservation may have committed while its answer was lost (the ledger is
    away); it sent nothing and says so, with its owner token. The second completes."""
    REQUESTS.append(request)
    SLEPT.append(activity.info().scheduled_time)
    if len(REQUESTS) == 1:
        raise ApplicationError(
            "not sent: the ledger is away",
            {"owner": "wf/1#1@w"},
            type=ERR_LEDGER_UNAVAILABLE,
            non_retryable=True,
        )
    key = compensation_key(request.key)
    return ToolOutcome(tool_call_id=key, tool="refund", key=key, status=Status.COMPLETED)


async def test_a_compensation_not_sent_for_the_ledger_is_reserved_again_naming_the_lost_owner(
    temporal_env: WorkflowEnvironment,
) -> None:
    REQUESTS.clear()
    SLEPT.clear()
    INSPECTED.clear()
    result = await _compensate(temporal_env, [plan, answer_lost_once, inspect, finish])
    assert result.status is Status.COMPLETED
    assert [r.unsent_owners for r in REQUESTS] == [[], ["wf/1#1@w"]]
    assert INSPECTED == []  # "not sent" is known: nothing to look for, nothing left unknown
    assert SLEPT[1] - SLEPT[0] >= RESERVE_BACKOFF_INITIAL  # the ledger is given time to come back


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
