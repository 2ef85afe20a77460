"""Ledger steps the workflow runs with retries: they only read or compare-and-set, never send."""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio import activity
from temporalio.exceptions import ApplicationError

from onceflow.activities.held import wake_held
from onceflow.activities.outcomes import outcome_from_record
from onceflow.activities.sending import record_outcome
from onceflow.activities.signal_door import SignalDoor, SignalRefused
from onceflow.ledger import (
    AlreadySettledError,
    EventSource,
    FailureKind,
    InvalidTransitionError,
    Ledger,
    ReasonRequiredError,
    RecordNotFoundError,
    Status,
    unauthenticated_actor,
)
from onceflow.sdk.payloads import (
    CallRef,
    EscalateInput,
    ExpireApprovalInput,
    OwnerOutcome,
    SettleInput,
    SettleResult,
    ToolOutcome,
)

APPROVAL_DEADLINE_ACTOR = "onceflow:approval-deadline"


class LedgerActivities:
    def __init__(self, ledger: Ledger, door: SignalDoor | None = None) -> None:
        self.ledger = ledger
        # In-process workers (tests, benchmarks) default to an open door; `onceflow worker` passes
        # the deployment's (ONCEFLOW_SIGNALS, default verified).
        self.door = door or SignalDoor()

    @activity.defn(name="inspect_call")
    async def inspect_call(self, ref: CallRef) -> ToolOutcome | None:
        """After a write activity was lost: what does the ledger know?

        No row: nothing was reserved, so nothing was sent (None); nor for a call `started` by an
        attempt whose reservation answer was lost (`ref.unsent_owners`): it is released as not
        attempted first. `started` past its owner's lease:
        it may have been sent, so it becomes `indeterminate`. `started` within it is left alone (its
        owner may still be sending it): the outcome says until when, and the workflow asks again
        then. Anything else is the ledger's answer as it stands.
        """
        record = await self.ledger.find(ref.key)
        if record is None:
            return None
        if record.status is Status.STARTED and record.owner in ref.unsent_owners:
            # Reserved by an attempt whose answer was lost, which therefore sent nothing (the one
            # that knew it died before it could say so): not attempted, and the run sends it again.
            await self.ledger.fail(
                ref.key,
                owner=record.owner,
                kind=FailureKind.NOT_ATTEMPTED,
                error="its reservation committed but the answer was lost; nothing was sent",
            )
            return None
        if record.status is Status.STARTED:
            record = await self.ledger.mark_indeterminate(
                ref.key,
                actor="inspector",
                reason="the activity running this call timed out or its worker died",
                source=EventSource.INSPECTOR,
                lease_ended=True,
            )
        return outcome_from_record(record)

    @activity.defn(name="record_outcome")
    async def record_outcome(self, outcome: OwnerOutcome) -> ToolOutcome:
        return await record_outcome(self.ledger, outcome)

    @activity.defn(name="settle_call")
    async def settle_call(self, request: SettleInput) -> SettleResult:
        """A resolve signal: settle by compare-and-set if it carries a status, then read the truth.

        A resolve that lost to an earlier decision is not an error for the run (the ledger's answer
        stands and the run acts on it), but it is reported back as `refused`, naming the winner.
        Nobody authenticated the signal's actor: it is recorded as `signal:<name>` (or `update:`),
        with the name as typed kept in the event's detail; with an operator assertion, the name is
        the one the API signed. A resolve with a status must first get through the signal door
        (activities/signal_door.py); one it refuses changes nothing and fails this activity.
        """
        signal = request.signal
        source = EventSource(request.source)
        actor = unauthenticated_actor(source, signal.actor)
        refused = None
        detail = {"claimed_actor": signal.actor} if signal.actor != actor else {}
        if signal.status is not None:
            try:
                asserted = self.door.admit(
                    tenant=request.tenant, key=signal.key, assertion=signal.assertion, now=datetime.now(UTC)
                )
            except SignalRefused as exc:
                activity.logger.warning(
                    "resolve of %s by %s refused at the signal door: %s", signal.key, actor, exc
                )
                raise ApplicationError(
                    f"resolve by {actor} refused: {exc}", type="SignalRefused", non_retryable=True
                ) from None
            if asserted is not None:
                actor = unauthenticated_actor(source, asserted)
                detail = {"claimed_actor": signal.actor, "asserted_operator": asserted}
        try:
            if signal.status is not None:
                await self.ledger.settle(
                    signal.key,
                    status=Status(signal.status),
                    actor=actor,
                    reason=signal.reason or "",
                    evidence=signal.evidence,
                    result=signal.result,
                    tenant=request.tenant,
                    source=source,
                    detail=detail or None,
                )
            record = await self.ledger.get(signal.key, with_events=False, tenant=request.tenant)
        except ReasonRequiredError as exc:
            raise ApplicationError(str(exc), type="InvalidResolve", non_retryable=True) from exc
        except RecordNotFoundError as exc:
            raise ApplicationError(str(exc), type="RecordNotFound", non_retryable=True) from exc
        except InvalidTransitionError as exc:
            activity.logger.info("resolve of %s lost the race: %s", signal.key, exc)
            refused = f"resolve by {actor} refused: {exc}"
            record = await self.ledger.get(signal.key, with_events=False, tenant=request.tenant)
        await wake_held(self.ledger, record)
        return SettleResult(outcome=outcome_from_record(record), refused=refused)

    @activity.defn(name="expire_approval")
    async def expire_approval(self, request: ExpireApprovalInput) -> ToolOutcome:
        """The approval deadline passed: deny the call, unless an operator decided first."""
        try:
            record = await self.ledger.deny(
                request.key,
                actor=APPROVAL_DEADLINE_ACTOR,
                reason=request.reason,
                tenant=request.tenant,
                source=EventSource.DEADLINE,
            )
        except AlreadySettledError as exc:
            activity.logger.info("approval deadline of %s came after a decision: %s", request.key, exc)
            record = await self.ledger.get(request.key, with_events=False, tenant=request.tenant)
        await wake_held(self.ledger, record)
        return outcome_from_record(record)

    @activity.defn(name="escalate_call")
    async def escalate_call(self, request: EscalateInput) -> ToolOutcome:
        """Name the owner who must look at an unknown call; its outcome stays as it is."""
        record = await self.ledger.escalate(
            request.key,
            owner=request.owner,
            actor="reconciler",
            reason=request.reason,
            source=EventSource.RECONCILER,
        )
        return outcome_from_record(record)
