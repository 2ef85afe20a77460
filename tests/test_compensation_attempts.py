"""The compensation workflow's attempts: what it does when one fails, each way an attempt can end
without its outcome in the ledger (tests/test_lost_compensations.py holds the activity's side).

The activities are test doubles under the real activities' names, so each test decides how its
attempts end; the workflow runs on a real Temporal dev server. Each test's record is what its
doubles were asked, in order.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from temporalio import activity
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.activities.compensation import compensation_key
from onceflow.ledger import Status
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
