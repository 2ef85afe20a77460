"""Reading a run's Temporal history in tests: which activities ran, how they ended; and resetting a run."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType, ResetReapplyType
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client

from onceflow.sdk.payloads import ResolveSignal


@dataclass(frozen=True)
class ActivityRun:
    """One scheduled activity and how it ended (if it has)."""

    activity_type: str
    scheduled_event_id: int
    closed: HistoryEvent | None

    @property
    def failure(self) -> Failure | None:
        if self.closed is None or self.closed.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            return None
        return self.closed.activity_task_failed_event_attributes.failure


async def history_events(client: Client, workflow_id: str, run_id: str | None = None) -> list[HistoryEvent]:
    """The events of one run of a workflow (its latest run unless `run_id` names one)."""
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    return list(history.events)


def activity_runs(events: list[HistoryEvent]) -> list[ActivityRun]:
    """Activities in the order they were scheduled, each with the event that closed it."""
    scheduled: dict[int, str] = {}
    closed: dict[int, HistoryEvent] = {}
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
        for name in (
            "activity_task_completed_event_attributes",
            "activity_task_failed_event_attributes",
            "activity_task_timed_out_event_attributes",
        ):
            if event.HasField(name):
                closed[getattr(event, name).scheduled_event_id] = event
    return [ActivityRun(kind, event_id, closed.get(event_id)) for event_id, kind in scheduled.items()]


def workflow_task_completed_after(events: list[HistoryEvent], event_id: int) -> int:
    """The id of the first WorkflowTaskCompleted event after `event_id`: a point a run can be reset to."""
    for event in events:
        if event.event_id > event_id and event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            return event.event_id
    raise LookupError(f"no workflow task completed after event {event_id}")


async def reset_run(
    client: Client, workflow_id: str, run_id: str, event_id: int, reason: str, *, reapply_signals: bool = True
) -> str:
    """Reset a run to the workflow task that finished at `event_id`; returns the new run's id."""
    response = await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id),
            reason=reason,
            workflow_task_finish_event_id=event_id,
            request_id=str(uuid.uuid4()),
            reset_reapply_type=(
                ResetReapplyType.RESET_REAPPLY_TYPE_SIGNAL
                if reapply_signals
                else ResetReapplyType.RESET_REAPPLY_TYPE_NONE
            ),
        )
    )
    return response.run_id


async def resolve_signals(client: Client, workflow_id: str) -> list[ResolveSignal]:
    """The `resolve` signals a workflow received, in order."""
    signals = []
    for event in await history_events(client, workflow_id):
        if event.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            continue
        signaled = event.workflow_execution_signaled_event_attributes
        if signaled.signal_name == "resolve":
            signals.append(
                client.data_converter.payload_converter.from_payload(
                    signaled.input.payloads[0], ResolveSignal
                )
            )
    return signals
