"""Sending one write once, and asking the ledger about it.

Run the write activity (the ledger reserves first); when an attempt was lost, let the ledger say
what happened; settle or re-read a call; start an unknown call's reconciler. Deterministic code
only: a layer of WriteCalls, run inside the hosting workflow.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    WorkflowAlreadyStartedError,
)
from temporalio.exceptions import (
    TimeoutError as TemporalTimeoutError,
)

with workflow.unsafe.imports_passed_through():
    from onceflow.activities.ledger_steps import LedgerActivities
    from onceflow.activities.tools import ToolActivities
    from onceflow.ledger.status import SETTLED, Status
    from onceflow.runtime.constants import (
        ACTIVITY_MARGIN,
        ERR_BUDGET_LIMIT_UNAVAILABLE,
        ERR_INVALID_RUN_ID,
        ERR_LEDGER_UNAVAILABLE,
        ERR_OUTCOME_NOT_RECORDED,
        ERR_PAYLOAD_MISMATCH,
        ERR_RUN_ID_TAKEN,
        ERR_TENANT_MISMATCH,
        INSPECT_AFTER_LEASE,
        LEDGER_RETRY,
        LEDGER_STEP_TIMEOUT,
        RESERVE_BACKOFF_INITIAL,
        RESERVE_BACKOFF_MAX,
        WRITE_ONCE,
    )
    from onceflow.sdk.payloads import (
        AgentSpec,
        CallRef,
        OwnerOutcome,
        ReconcileInput,
        ResolveSignal,
        SettleInput,
        SettleResult,
        ToolCallInput,
        ToolOutcome,
        ToolSpec,
    )
    from onceflow.workflows.reconcile import ReconcileWorkflow, reconcile_workflow_id

from onceflow.workflows.write_state import WriteCallState, with_unsent_owner

# A write activity that failed in an unexpected way before reserving is run again at most this often.
_MAX_UNRESERVED_RERUNS = 3


class WriteSends(WriteCallState):
    """Send once, inspect, settle, start a reconciler."""

    async def _settle(self, request: ResolveSignal, *, source: str) -> SettleResult:
        """Settle (or only re-read) one call in the ledger and act on the ledger's answer."""
        settled = await workflow.execute_activity_method(
            LedgerActivities.settle_call,
            SettleInput(
                tenant=self._tenant, signal=request, source="update" if source == "update" else "signal"
            ),
            start_to_close_timeout=LEDGER_STEP_TIMEOUT,
            retry_policy=LEDGER_RETRY,
            summary=f"{'resolve' if request.status else 'read'} {request.key} ({source}: {request.actor})",
        )
        if settled.refused:
            self._last_resolve_error = settled.refused
            workflow.logger.warning("%s", settled.refused)
        outcome = settled.outcome
        pending = self._pending.get(request.key)
        waiting_for_approval = pending is not None and pending.status == Status.AWAITING_APPROVAL
        if outcome.status in SETTLED and pending is not None and not waiting_for_approval:
            self._resolved[request.key] = outcome
        return settled

    async def _send_once(self, tool: ToolSpec, tool_input: ToolCallInput, ref: CallRef) -> ToolOutcome:
        """Run the write activity; if it was lost, let the ledger say what happened."""
        backoff = RESERVE_BACKOFF_INITIAL
        unexpected = 0
        attempt_input = tool_input
        while True:
            began = workflow.now()
            try:
                return await workflow.execute_activity_method(
                    ToolActivities.run_write_tool,
                    attempt_input,
                    start_to_close_timeout=timedelta(seconds=tool.timeout_seconds) + ACTIVITY_MARGIN,
                    retry_policy=WRITE_ONCE,
                    summary=f"{ref.tool} {ref.key}",
                )
            except ActivityError as err:
                cause = err.cause
                kind = cause.type if isinstance(cause, ApplicationError) else None
                if kind in (ERR_LEDGER_UNAVAILABLE, ERR_BUDGET_LIMIT_UNAVAILABLE):
                    # Nothing was sent. Retry the reservation, never the tool; a recorded call whose
                    # budget limit could not be read stays as the ledger has it meanwhile. A
                    # reservation that committed while its answer was lost is the attempt's own:
                    # the next attempt knows it by its owner token.
                    attempt_input = with_unsent_owner(attempt_input, cause)
                    what = "ledger" if kind == ERR_LEDGER_UNAVAILABLE else "budget limit"
                    workflow.set_current_details(f"{what} unavailable; will reserve {ref.key} again")
                    await workflow.sleep(backoff)
                    backoff = min(backoff * 2, RESERVE_BACKOFF_MAX)
                    continue
                if kind in (ERR_PAYLOAD_MISMATCH, ERR_TENANT_MISMATCH, ERR_RUN_ID_TAKEN, ERR_INVALID_RUN_ID):
                    # The key is bound to another call (or could be): a bug, an injection or a
                    # reused run id, never a retry. Nothing was reserved or sent.
                    raise ApplicationError(str(cause), type=kind, non_retryable=True) from err
                if kind == ERR_OUTCOME_NOT_RECORDED and isinstance(cause, ApplicationError):
                    return await workflow.execute_activity_method(
                        LedgerActivities.record_outcome,
                        OwnerOutcome.model_validate(cause.details[0]),
                        start_to_close_timeout=LEDGER_STEP_TIMEOUT,
                        retry_policy=LEDGER_RETRY,
                        summary=f"record outcome {ref.key}",
                    )
                if attempt_input.unsent_owners:  # a reservation of theirs was never sent
                    ref = ref.model_copy(update={"unsent_owners": attempt_input.unsent_owners})
                found = await self._inspect(ref)
                if found is not None:
                    return found
                # No row: nothing was reserved, so nothing was sent; it is safe to run it. Unless
                # a failover of the ledger lost the row: the next attempt is told when this one
                # began, and sends nothing if the ledger failed over since (ledger/lost_writes.py).
                if attempt_input.lost_attempt_at is None:
                    attempt_input = attempt_input.model_copy(update={"lost_attempt_at": began})
                if not isinstance(cause, TemporalTimeoutError):
                    unexpected += 1
                    if unexpected > _MAX_UNRESERVED_RERUNS:
                        raise ApplicationError(
                            f"write {ref.key} failed before reserving, {unexpected} times: {cause}",
                            type="WriteActivityBroken",
                            non_retryable=True,
                        ) from err

    async def _inspect(self, ref: CallRef) -> ToolOutcome | None:
        """What the ledger says of a call whose attempt was lost; a call still within its owner's
        lease is waited for (its owner may be sending it) and asked about again once it ran out."""
        while True:
            found = await self._inspect_once(ref)
            if found is None or found.status is not Status.STARTED or found.lease_expires_at is None:
                return found
            left = (found.lease_expires_at - workflow.now()).total_seconds()
            workflow.set_current_details(
                f"{ref.key} ({ref.tool}) may still be on the wire: its owner holds it until "
                f"{found.lease_expires_at.isoformat()}; the ledger is asked again then"
            )
            await workflow.sleep(max(left, 0.0) + INSPECT_AFTER_LEASE.total_seconds())

    async def _inspect_once(self, ref: CallRef) -> ToolOutcome | None:
        return await workflow.execute_activity_method(
            LedgerActivities.inspect_call,
            ref,
            start_to_close_timeout=LEDGER_STEP_TIMEOUT,
            retry_policy=LEDGER_RETRY,
            summary=f"inspect {ref.key}",
        )

    async def _start_reconcile(self, spec: AgentSpec, tool: ToolSpec, ref: CallRef) -> None:
        policy = spec.policy
        try:
            await workflow.start_child_workflow(
                ReconcileWorkflow.run,
                ReconcileInput(
                    key=ref.key,
                    run_id=workflow.info().workflow_id,
                    tenant=self._tenant,
                    agent=spec.name,
                    tool=ref.tool,
                    deadline_seconds=policy.reconcile_deadline_seconds,
                    initial_interval_seconds=policy.reconcile_initial_interval_seconds,
                    max_interval_seconds=policy.reconcile_max_interval_seconds,
                    tool_timeout_seconds=tool.timeout_seconds,
                    escalation_owner=policy.escalation_owner,
                ),
                id=reconcile_workflow_id(ref.key),
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                static_summary=f"reconcile {ref.tool} {ref.key}",
            )
        except WorkflowAlreadyStartedError:
            pass  # one reconciler per call, however often the run gets here
