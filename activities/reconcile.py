"""Reconcile: ask the tool's own hook whether an unknown call took effect, and settle it if it knows."""

from __future__ import annotations

import asyncio

from temporalio import activity

from activities.conflicts import tell_run_of_conflict
from activities.held import wake_held
from activities.outcomes import outcome_from_record
from ledger import EventSource, InvalidTransitionError, Ledger, Status
from onceflow.agents import AgentRegistry
from onceflow.payloads import ReconcileInput, ToolOutcome
from onceflow.tools import OutcomeStatus, ToolContext

RECONCILER = "reconciler"


class ReconcileActivities:
    def __init__(self, ledger: Ledger, registry: AgentRegistry) -> None:
        self.ledger = ledger
        self.registry = registry

    @activity.defn(name="reconcile_call")
    async def reconcile_call(self, request: ReconcileInput) -> ToolOutcome:
        """Run the hook once. A definite answer settles the call; `unknown` leaves it as it is."""
        record = await self.ledger.get(request.key, with_events=False)
        if record.status is not Status.INDETERMINATE:
            return outcome_from_record(record)
        tool = self.registry.tool(request.agent, request.tool)
        if tool.reconcile is None:
            return outcome_from_record(record)
        context = ToolContext(
            idempotency_key=record.key,
            run_id=record.run_id,
            tool_call_id=record.tool_call_id,
            tenant=record.tenant,
            attempt=record.attempt,
            logger=activity.logger,
        )
        found = await asyncio.wait_for(
            tool.run_reconcile(record.payload["arguments"], context), tool.effect.timeout.total_seconds()
        )
        if found.status is OutcomeStatus.UNKNOWN:
            return outcome_from_record(record)
        try:
            if found.status is OutcomeStatus.COMPLETED:
                record = await self.ledger.settle(
                    record.key,
                    status=Status.COMPLETED,
                    actor=RECONCILER,
                    reason=f"reconcile hook of {tool.name} found the effect",
                    evidence=found.evidence or None,
                    result=found.value,
                    result_reference=found.result_reference,
                    source=EventSource.RECONCILER,
                )
            else:
                record = await self.ledger.settle(
                    record.key,
                    status=Status.FAILED,
                    actor=RECONCILER,
                    reason=f"reconcile hook of {tool.name} proved the effect absent",
                    evidence=found.evidence or None,
                    source=EventSource.RECONCILER,
                )
        except InvalidTransitionError:
            # An operator (or another reconciler) got there first; theirs stands, ours is noted,
            # and if ours contradicts theirs the call is flagged as a conflict.
            record = await self.ledger.record_late_outcome(
                record.key,
                actor=RECONCILER,
                status=Status(found.status.value),
                evidence=found.evidence or None,
                source=EventSource.RECONCILER,
            )
            if record.has_conflict:
                await tell_run_of_conflict(record)
        await wake_held(self.ledger, record)
        return outcome_from_record(record)
