"""Compensation: undo a completed call because an operator asked, as a write of its own.

The compensation is a single-attempt call with its own key, `<key>:compensation`, reserved in the
same ledger before it runs. When it takes effect, the original call becomes `compensated`.
"""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from onceflow import metrics
from onceflow.activities.outcomes import outcome_from_record, owner_token
from onceflow.activities.tools import record_outcome, send_once
from onceflow.ledger import (
    CallIdentity,
    EventSource,
    Ledger,
    LedgerUnavailableError,
    Status,
    ToolExecutionRecord,
)
from onceflow.runtime.agents import AgentRegistry
from onceflow.runtime.constants import ACTIVITY_MARGIN, ERR_LEDGER_UNAVAILABLE, ERR_NO_COMPENSATION
from onceflow.sdk.payloads import CompensationInput, CompensationPlan, ToolOutcome
from onceflow.sdk.tools import Tool, ToolContext

COMPENSATION_SUFFIX = ":compensation"


def compensation_key(key: str) -> str:
    return key + COMPENSATION_SUFFIX


class CompensationActivities:
    def __init__(self, ledger: Ledger, registry: AgentRegistry, worker_identity: str) -> None:
        self.ledger = ledger
        self.registry = registry
        self.worker_identity = worker_identity

    async def _original(self, request: CompensationInput) -> tuple[ToolExecutionRecord, Tool]:
        record = await self.ledger.get(request.key, with_events=False, tenant=request.tenant)
        tool = self.registry.tool(record.agent, record.tool_name)
        if tool.compensation is None:
            raise ApplicationError(
                f"tool {tool.name!r} declares no compensation", type=ERR_NO_COMPENSATION, non_retryable=True
            )
        return record, tool

    @activity.defn(name="plan_compensation")
    async def plan_compensation(self, request: CompensationInput) -> CompensationPlan:
        """Check that the call can be undone and say how long the undo may take."""
        record, tool = await self._original(request)
        if record.status not in (Status.COMPLETED, Status.COMPENSATED):
            raise ApplicationError(
                f"{record.key} is {record.status}; only a completed call can be compensated",
                type="NotCompensable",
                non_retryable=True,
            )
        assert tool.compensation is not None
        return CompensationPlan(
            compensation_key=compensation_key(record.key),
            hook=tool.compensation.__name__,
            timeout_seconds=tool.effect.timeout.total_seconds(),
        )

    @activity.defn(name="run_compensation")
    async def run_compensation(self, request: CompensationInput) -> ToolOutcome:
        """Reserve `<key>:compensation`, run the hook once with that key, record what happened."""
        original, tool = await self._original(request)
        assert tool.compensation is not None
        hook = tool.compensation
        owner = owner_token(self.worker_identity)
        identity = CallIdentity(
            tenant=original.tenant,
            run_id=original.run_id,
            tool_call_id=original.tool_call_id + COMPENSATION_SUFFIX,
            agent=original.agent,
        )
        try:
            reservation = await self.ledger.reserve(
                identity,
                tool_name=hook.__name__,
                side_effect=tool.side_effect,
                arguments={"compensates": original.key},
                owner=owner,
                lease=tool.effect.timeout + ACTIVITY_MARGIN,
            )
        except LedgerUnavailableError as exc:
            raise ApplicationError(
                f"not sent: {exc}", type=ERR_LEDGER_UNAVAILABLE, non_retryable=True
            ) from exc
        if not reservation.may_send:
            return outcome_from_record(reservation.record, replayed=True)
        context = ToolContext(
            idempotency_key=identity.key,
            run_id=original.run_id,
            tool_call_id=identity.tool_call_id,
            tenant=original.tenant,
            attempt=reservation.record.attempt,
            logger=activity.logger,
        )
        outcome = await send_once(
            lambda: hook(original, context),
            tool_name=hook.__name__,
            timeout=tool.effect.timeout.total_seconds(),
            context=context,
            owner=owner,
        )
        metrics.record_send(hook.__name__, outcome.status)
        return await record_outcome(self.ledger, outcome)

    @activity.defn(name="finish_compensation")
    async def finish_compensation(self, request: CompensationInput) -> ToolOutcome:
        """If the compensation took effect, the original becomes `compensated`. Returns the original."""
        done = await self.ledger.get(compensation_key(request.key), with_events=False, tenant=request.tenant)
        if done.status is Status.COMPLETED:
            # The actor is the operator who asked the API for it; the source says it was
            # recorded by the compensation workflow, not by the API's own request.
            record = await self.ledger.mark_compensated(
                request.key,
                actor=request.actor,
                reason=request.reason,
                evidence={"compensation_key": done.key, "result": done.result},
                source=EventSource.COMPENSATION,
            )
        else:
            record = await self.ledger.get(request.key, with_events=False, tenant=request.tenant)
        return outcome_from_record(record)
