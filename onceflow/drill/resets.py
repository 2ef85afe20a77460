"""The drill as Temporal's reset: it walks the reset runs (RunPath.RESET).

A reset run's agent gets a new tool call id on every answer (tools.py `fresh_id_model`), so a reset
to before a credit turn makes the model ask for its credits again under keys the run has not seen.
The drill waits for the planned moment, then resets the run's current Temporal run, with Temporal's
own reset API, to the workflow task that followed the model's answer *before* the planned credit
turn (`turn` 1: before the first credit; 2: before the second, so the first is replayed under its
own key and only the second is re-issued):
- `done`: once the run has completed, every earlier credit settled;
- `in_flight`: as soon as billing shows the run's first credit (billing applied it and holds the
  answer, so the attempt is still on the wire; the new run's re-issue meets it unresolved).
Signals are re-applied, as by default. The old run's activity keeps running on its worker; its
outcome lands in the ledger under its own key.
"""

from __future__ import annotations

import uuid

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType, ResetReapplyType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus

from onceflow.drill.scenario import PlannedRun
from onceflow.drill.walks import Walk, until
from onceflow.examples.billing.client import BillingClient

_MODEL_ACTIVITY = "call_model"


def point_before_turn(events: list[HistoryEvent], turn: int) -> int:
    """The event id to reset to so that the model is asked for answer `turn` again: the workflow task
    completed right after the model's answer `turn - 1` was recorded."""
    model_calls = {
        event.event_id
        for event in events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and event.activity_task_scheduled_event_attributes.activity_type.name == _MODEL_ACTIVITY
    }
    answered = [
        event.event_id
        for event in events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        and event.activity_task_completed_event_attributes.scheduled_event_id in model_calls
    ]
    if len(answered) < turn:
        raise LookupError(f"the run has {len(answered)} model answers, none before turn {turn} to reset to")
    after = answered[turn - 1]
    for event in events:
        if event.event_id > after and event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            return event.event_id
    raise LookupError(f"no workflow task completed after the model answer at event {after}")


async def reset_to(client: Client, workflow_id: str, run_id: str, event_id: int, reason: str) -> str:
    """Reset one Temporal run to the workflow task that completed at `event_id`; the new run's id."""
    response = await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id),
            reason=reason,
            workflow_task_finish_event_id=event_id,
            request_id=str(uuid.uuid4()),
            reset_reapply_type=ResetReapplyType.RESET_REAPPLY_TYPE_SIGNAL,
        )
    )
    return response.run_id


async def walk_reset(plan: PlannedRun, walk: Walk, *, client: Client, billing: BillingClient) -> None:
    """Reset one run at its planned moment (the module docstring); never raises."""
    moment, turn = plan.condition["moment"], int(plan.condition["turn"])
    walk.moment = moment
    handle = client.get_workflow_handle(plan.run_id)
    try:
        if moment == "done":
            await until(handle.describe, _completed, f"{plan.run_id} to complete")
        else:
            await until(lambda: billing.credits(plan.account_id), bool, f"a credit on {plan.account_id}")
        walk.step(f"moment {moment} reached")
        described = await handle.describe()
        history = await client.get_workflow_handle(plan.run_id, run_id=described.run_id).fetch_history()
        event_id = point_before_turn(list(history.events), turn)
        walk.reset_from, walk.reset_event_id = described.run_id, event_id
        walk.reset_to = await reset_to(
            client,
            plan.run_id,
            described.run_id,
            event_id,
            f"drill: the model is asked for turn {turn} again",
        )
        walk.step(f"reset to event {event_id}, before credit turn {turn}: new run {walk.reset_to}")
    except Exception as exc:  # the walk's failure is reported; the run goes on as it is
        walk.error = f"{type(exc).__name__}: {exc}"
    finally:
        walk.done = True


def _completed(described: WorkflowExecutionDescription) -> bool:
    return described.status == WorkflowExecutionStatus.COMPLETED
