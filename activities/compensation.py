"""Compensation: undo a completed call because an operator asked, as a write of its own.

The compensation is a single-attempt call with its own key, `<key>:compensation`, reserved in the
same ledger before it runs. When it takes effect, the original call becomes `compensated`.

Who asked is read from the ledger, never from the workflow's input: the operator API appends a
`compensation_requested` event (ledger/compensations.py), and planning claims it for this workflow
run. A run started by hand finds nothing to claim and is refused before anything is reserved.
"""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from onceflow import metrics
from onceflow.activities.outcomes import attempt_began, attempt_deadline, outcome_from_record, owner_token
from onceflow.activities.sending import record_sent_outcome, send_once, unknown_if_failed_over
from onceflow.ledger import (
    AttemptExpiredError,
    CallIdentity,
    CompensationNotRequestedError,
    EventSource,
    Ledger,
    LedgerUnavailableError,
    Status,
    ToolExecutionRecord,
)
from onceflow.ledger.compensations import COMPENSATION_ACTOR
from onceflow.runtime.agents import AgentRegistry
from onceflow.runtime.constants import (
    ACTIVITY_MARGIN,
    DEFAULT_RECHECK,
    ERR_ATTEMPT_EXPIRED,
    ERR_COMPENSATION_NOT_REQUESTED,
    ERR_LEDGER_UNAVAILABLE,
    ERR_NO_COMPENSATION,
)
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
        """Check that an operator asked (claiming the request for this run), that the call can be
        undone, and say how long the undo may take."""
        record, tool = await self._original(request)
        if record.status not in (Status.COMPLETED, Status.COMPENSATED):
            raise ApplicationError(
                f"{record.key} is {record.status}; only a completed call can be compensated",
                type="NotCompensable",
                non_retryable=True,
            )
        try:
            asked = await self.ledger.claim_compensation_request(
                record.key, workflow_run_id=activity.info().workflow_run_id or ""
            )
        except CompensationNotRequestedError as exc:
            raise ApplicationError(str(exc), type=ERR_COMPENSATION_NOT_REQUESTED, non_retryable=True) from exc
        if asked.actor != request.actor:
            activity.logger.warning(
                "compensation of %s: input names %r, the ledger's request %r; the ledger's stands",
                record.key,
                request.actor,
                asked.actor,
            )
        assert tool.compensation is not None
        agent = self.registry.agents.get(record.agent)
        return CompensationPlan(
            compensation_key=compensation_key(record.key),
            hook=tool.compensation.__name__,
            timeout_seconds=tool.effect.timeout.total_seconds(),
            recheck_interval_seconds=agent.config.tool_policy.recheck_interval.total_seconds()
            if agent is not None
            else DEFAULT_RECHECK.total_seconds(),
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
                not_after=attempt_deadline(),
                began_at=attempt_began(),
                # Earlier attempts whose answer was lost: a reservation of theirs was never sent.
                unsent_owners=request.unsent_owners,
            )
        except AttemptExpiredError as exc:
            raise ApplicationError(str(exc), type=ERR_ATTEMPT_EXPIRED, non_retryable=True) from exc
        except LedgerUnavailableError as exc:
            # Perhaps the reservation committed and only its answer was lost: the next attempt
            # recognises it by this attempt's owner token.
            raise ApplicationError(
                f"not sent: {exc}", {"owner": owner}, type=ERR_LEDGER_UNAVAILABLE, non_retryable=True
            ) from exc
        if not reservation.may_send:
            return outcome_from_record(reservation.record, replayed=True)
        if request.lost_attempt_at is not None:
            unknown = await unknown_if_failed_over(self.ledger, request.lost_attempt_at, reservation.record)
            if unknown is not None:
                return outcome_from_record(unknown)
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
        # With the row it reserved: a row a failover lost meanwhile is written back unknown, never
        # "not found" (which the workflow would read as nothing reserved, and run the hook again).
        outcome = outcome.model_copy(update={"reserved": reservation.record})
        return await record_sent_outcome(self.ledger, outcome)

    @activity.defn(name="finish_compensation")
    async def finish_compensation(self, request: CompensationInput) -> ToolOutcome:
        """If the compensation took effect, the original becomes `compensated`. Returns the original."""
        done = await self.ledger.get(compensation_key(request.key), with_events=False, tenant=request.tenant)
        if done.status is Status.COMPLETED:
            # The actor is the operator whose request (written by the API) this run claimed, never
            # the input's; the source says the compensation workflow recorded it. A run planned
            # before requests were claimed has none: it records no operator.
            asked = await self.ledger.claimed_compensation_request(request.key)
            record = await self.ledger.mark_compensated(
                request.key,
                actor=asked.actor if asked else COMPENSATION_ACTOR,
                reason=asked.reason if asked else f"{request.reason} (no operator request in the ledger)",
                evidence={"compensation_key": done.key, "result": done.result},
                source=EventSource.COMPENSATION,
            )
        else:
            record = await self.ledger.get(request.key, with_events=False, tenant=request.tenant)
        return outcome_from_record(record)
