"""Reconcile: find out whether an unknown call took effect, and settle it when the answer is definite.

Two strategies, in this order:
1. the tool's reconcile hook, when it has one (a hook that raises `ToolKeyNotFoundError` proved
   the effect absent); a tool whose receiver is on onceflow's receiver kit (`receiver=`) has the
   kit's: the receiver's own record of the key, by lookup and fence;
2. when there is no hook, or it answered unknown, and the tool declares a receiver dedup window:
   send the call again with the same key, if the ledger says the window still allows it
   (ledger/resends.py). The receiver honours the key, so the answer is the first request's answer,
   or the call applied now if the first never arrived: either way one effect. A success settles
   the call completed; only an answer saying the receiver has no record of the key
   (`ToolKeyNotFoundError`) settles it failed. Every other refusal leaves it unknown.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from temporalio import activity

from onceflow import metrics
from onceflow.activities.conflicts import tell_run_of_conflict
from onceflow.activities.held import wake_held
from onceflow.activities.outcomes import outcome_from_record
from onceflow.activities.sending import send_once, unkeepable_result
from onceflow.ledger import (
    EventSource,
    FailureKind,
    InvalidTransitionError,
    Ledger,
    OwnerLeaseLiveError,
    ResendDecision,
    Status,
    ToolExecutionRecord,
)
from onceflow.runtime.agents import AgentRegistry
from onceflow.runtime.constants import ACTIVITY_MARGIN
from onceflow.sdk.payloads import OwnerOutcome, ReconcileInput, ToolOutcome, result_problem
from onceflow.sdk.tools import OutcomeStatus, Tool, ToolContext

RECONCILER = "reconciler"
# What a resend must leave before the window's end, beyond the tool's own timeout: the receiver's
# clock and ours differ, and the request needs time on the wire.
RESEND_MARGIN = ACTIVITY_MARGIN
# Kept free at the end of this activity's own time, so a resend cut short is recorded as such.
_SPARE_SECONDS = 1.0


def _keepable(result: Any, evidence: dict[str, Any] | None) -> tuple[Any, dict[str, Any] | None]:
    """A lookup's or resend's answer as the ledger can store it: what JSON cannot carry (NaN,
    Infinity) is left out and said so, and the settlement itself still lands."""
    problem = result_problem(result)
    if problem is not None:
        result = {"result_omitted": unkeepable_result(problem)}
    problem = result_problem(evidence)
    if problem is not None:
        evidence = {"evidence_omitted": f"the evidence given cannot be kept: {problem}"}
    return result, evidence


class ReconcileActivities:
    def __init__(self, ledger: Ledger, registry: AgentRegistry) -> None:
        self.ledger = ledger
        self.registry = registry

    @activity.defn(name="reconcile_call")
    async def reconcile_call(self, request: ReconcileInput) -> ToolOutcome:
        """One round: the hook, then perhaps a resend. A definite answer settles the call;
        `unknown` leaves it as it is for the next round."""
        began = time.monotonic()
        record = await self.ledger.get(request.key, with_events=False)
        if record.status is not Status.INDETERMINATE:
            return outcome_from_record(record)
        tool = self.registry.tool(request.agent, request.tool)
        context = ToolContext(
            idempotency_key=record.key,
            run_id=record.run_id,
            tool_call_id=record.tool_call_id,
            tenant=record.tenant,
            attempt=record.attempt,
            logger=activity.logger,
        )
        if tool.reconcile is not None:
            found = await asyncio.wait_for(
                tool.run_reconcile(record.payload["arguments"], context), tool.effect.timeout.total_seconds()
            )
            # A receiver on the kit answers from its own record of the key (lookup, then fence): a
            # fenced key is refused if the request lands later, so its "absent" is proof at once.
            # A plain hook's "not there" is proof only once the owner's request can no longer land.
            kit = getattr(tool.reconcile, "receiver", None) is not None
            asked = (
                f"the receiver of {tool.name} (receiver kit: lookup and fence)"
                if kit
                else f"reconcile hook of {tool.name}"
            )
            if found.status is OutcomeStatus.COMPLETED:
                return await self._settle(
                    record,
                    Status.COMPLETED,
                    reason=f"{asked} found the effect",
                    evidence=found.evidence or None,
                    result=found.value,
                    result_reference=found.result_reference,
                )
            if found.status is OutcomeStatus.FAILED:
                return await self._settle(
                    record,
                    Status.FAILED,
                    reason=f"{asked} proved the effect absent",
                    evidence=found.evidence or None,
                    after_owner_lease=not kit,
                )
        if tool.effect.dedup_window is not None:
            return await self._resend(tool, record, context, began)
        return outcome_from_record(record)

    async def _resend(
        self, tool: Tool, record: ToolExecutionRecord, context: ToolContext, began: float
    ) -> ToolOutcome:
        """Send the call again with its own key, if the ledger says the window allows it now."""
        assert tool.effect.dedup_window is not None
        timeout = min(tool.effect.timeout.total_seconds(), self._time_left(began))
        if timeout <= 0:
            # The hook used up this round; the next round starts with a full allowance.
            return outcome_from_record(record)
        decision = await self.ledger.begin_resend(
            record.key,
            window=tool.effect.dedup_window,
            lead=tool.effect.timeout + RESEND_MARGIN,
            actor=RECONCILER,
        )
        if not decision.allowed:
            activity.logger.info("not re-sending %s: %s", record.key, decision.reason)
            return outcome_from_record(decision.record)
        sent = await send_once(
            lambda: tool.invoke(record.payload["arguments"], context),
            tool_name=tool.name,
            timeout=timeout,
            context=context,
            owner=RECONCILER,
        )
        metrics.record_send(tool.name, sent.status, resend=True)
        return await self._settle_resend(tool, decision, sent)

    async def _settle_resend(self, tool: Tool, decision: ResendDecision, sent: OwnerOutcome) -> ToolOutcome:
        record = decision.record
        evidence: dict[str, Any] = decision.evidence()
        if sent.status == "completed":
            return await self._settle(
                record,
                Status.COMPLETED,
                reason=f"re-sent with the same key inside {tool.name}'s receiver dedup window; "
                "the receiver's answer is the call's outcome",
                evidence=evidence,
                result=sent.value,
            )
        # Only a receiver saying it has no record of the key proves the first request never took
        # effect. Any other refusal may be about the key being known ("already used with a
        # different body", "request in progress": the first request arrived, and perhaps applied),
        # or a rule checked before the key; it proves nothing, so the call stays unknown. Not
        # attempted (the resend never left) says nothing about the first request either.
        if sent.status == "failed" and sent.no_record_of_key:
            return await self._settle(
                record,
                Status.FAILED,
                reason=f"re-sent with the same key inside {tool.name}'s receiver dedup window; "
                "the receiver has no record of the key, so the call never took effect",
                evidence={**evidence, "answer": sent.error, "answer_kind": "no_record_of_key"},
                failure_kind=FailureKind.NOT_APPLIED,
            )
        await self.ledger.append_event(
            record.key,
            actor=RECONCILER,
            kind="resend_inconclusive",
            source=EventSource.RECONCILER,
            from_status=Status.INDETERMINATE,
            reason=f"the resend told nothing: {sent.error or sent.status}"[:2000],
            detail={
                "resend": decision.resends,
                "answer_kind": sent.failure_kind.value if sent.failure_kind else sent.status,
                # A refusal came back, so the resend is off the wire and its lease ends now; a
                # timeout or a dropped connection may still be on it, until the lease runs out.
                "answered": sent.status == "failed",
            },
        )
        return outcome_from_record(await self.ledger.get(record.key, with_events=False))

    @staticmethod
    def _time_left(began: float) -> float:
        """Seconds this activity attempt may still spend before Temporal gives up on it."""
        allowed = activity.info().start_to_close_timeout
        if allowed is None:
            return float("inf")
        return allowed.total_seconds() - (time.monotonic() - began) - _SPARE_SECONDS

    async def _settle(
        self,
        record: ToolExecutionRecord,
        status: Status,
        *,
        reason: str,
        evidence: dict[str, Any] | None,
        result: Any = None,
        result_reference: str | None = None,
        failure_kind: FailureKind = FailureKind.NOT_APPLIED,
        after_owner_lease: bool = False,
    ) -> ToolOutcome:
        result, evidence = _keepable(result, evidence)
        try:
            settled = await self.ledger.settle(
                record.key,
                status=status,
                actor=RECONCILER,
                reason=reason,
                evidence=evidence,
                result=result,
                result_reference=result_reference,
                source=EventSource.RECONCILER,
                failure_kind=failure_kind,
                after_owner_lease=after_owner_lease,
            )
        except OwnerLeaseLiveError:
            # The hook found nothing while the owner's own request may still land (its owner timed
            # out and said "unknown", but the lease is live): no proof yet; the next round asks again.
            return outcome_from_record(await self.ledger.get(record.key, with_events=False))
        except InvalidTransitionError:
            # An operator (or another reconciler) got there first; theirs stands, ours is noted,
            # and if ours contradicts theirs the call is flagged as a conflict.
            settled = await self.ledger.record_late_outcome(
                record.key,
                actor=RECONCILER,
                status=status,
                evidence=evidence,
                result=result,
                result_reference=result_reference,
                source=EventSource.RECONCILER,
            )
            if settled.has_conflict:
                await tell_run_of_conflict(settled)
        await wake_held(self.ledger, settled)
        return outcome_from_record(settled)
