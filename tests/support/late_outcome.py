"""A workflow that runs the real `record_outcome` ledger step for a call, as the agent run would
after its write activity lost the ledger: how tests deliver a late owner outcome through Temporal."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel

    from onceflow.sdk.payloads import OwnerOutcome, ToolOutcome


class LateOutcomeInput(BaseModel):
    outcome: OwnerOutcome
    task_queue: str  # where the onceflow worker (and its ledger activities) listens


@workflow.defn
class RecordLateOutcome:
    @workflow.run
    async def run(self, request: LateOutcomeInput) -> ToolOutcome:
        return await workflow.execute_activity(
            "record_outcome",
            request.outcome,
            task_queue=request.task_queue,
            start_to_close_timeout=timedelta(seconds=10),
            result_type=ToolOutcome,
        )
