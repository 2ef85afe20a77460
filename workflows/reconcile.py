"""ReconcileWorkflow: settle one unknown call by asking the tool's reconcile hook, on a backoff.

Started by the run (id `reconcile:<key>`, so at most one per call) and left running if the run ends.
Each round reads the ledger first: if anyone has settled the call meanwhile, it stops. At the
deadline it escalates the call to the policy's owner (record, event, search attribute on this
workflow and on the run), without changing the outcome, and from then on only reads the ledger, every
`max_interval`, until a person settles the call. A settled outcome is passed to the run as a
`resolve` signal; the run then reads the ledger itself.

Search attributes: OnceflowUnresolvedKeys (the call, while unknown), OnceflowTenant,
OnceflowEscalatedTo (once escalated, until settled). So a call whose run has already failed under
`on_indeterminate: fail` is still found by its key in the Temporal UI, and only while it is unknown.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from onceflow.activities.ledger_steps import LedgerActivities
    from onceflow.activities.reconcile import ReconcileActivities
    from onceflow.ledger.status import Status
    from onceflow.runtime.constants import (
        ACTIVITY_MARGIN,
        ESCALATED_TO,
        LEDGER_RETRY,
        LEDGER_STEP_TIMEOUT,
        READ_RETRY,
        TENANT,
        UNRESOLVED_KEYS,
    )
    from onceflow.sdk.payloads import (
        EscalatedSignal,
        EscalateInput,
        ReconcileInput,
        ReconcileResult,
        ResolveSignal,
        SettleInput,
        ToolOutcome,
    )


# Runs started before this patch stop at the deadline and keep their search attributes as they were.
PATCH_RECONCILER_FOLLOWS_LEDGER = "reconciler-follows-ledger"


def reconcile_workflow_id(key: str) -> str:
    return f"reconcile:{key}"


@workflow.defn
class ReconcileWorkflow:
    @workflow.run
    async def run(self, request: ReconcileInput) -> ReconcileResult:
        deadline = workflow.now() + timedelta(seconds=request.deadline_seconds)
        interval = timedelta(seconds=request.initial_interval_seconds)
        longest = timedelta(seconds=request.max_interval_seconds)
        attempts = 0
        follows_ledger = workflow.patched(PATCH_RECONCILER_FOLLOWS_LEDGER)
        if follows_ledger:
            workflow.upsert_search_attributes(
                [UNRESOLVED_KEYS.value_set([request.key]), TENANT.value_set(request.tenant)]
            )
        while True:
            attempts += 1
            workflow.set_current_details(f"round {attempts}: asking {request.tool}'s reconcile hook")
            try:
                outcome: ToolOutcome | None = await workflow.execute_activity_method(
                    ReconcileActivities.reconcile_call,
                    request,
                    start_to_close_timeout=timedelta(seconds=request.tool_timeout_seconds) + ACTIVITY_MARGIN,
                    retry_policy=READ_RETRY,
                    summary=f"reconcile {request.tool} {request.key}",
                )
            except ActivityError as err:
                workflow.logger.warning("reconcile round %d for %s failed: %s", attempts, request.key, err)
                outcome = None
            if outcome is not None and outcome.status is not Status.INDETERMINATE:
                return await self._settled(request, Status(outcome.status), attempts, follows_ledger)
            remaining = deadline - workflow.now()
            if remaining <= timedelta(0):
                escalated_to = await self._escalate(request)
                workflow.set_current_details(
                    f"deadline passed; {request.key} is still indeterminate"
                    + (f" and was escalated to {escalated_to}" if escalated_to else "")
                    + ("; waiting for an operator to settle it" if follows_ledger else "")
                )
                if follows_ledger:
                    status = await self._watch_ledger(request, longest)
                    return await self._settled(request, status, attempts, follows_ledger, escalated_to)
                return ReconcileResult(
                    key=request.key,
                    status=Status.INDETERMINATE,
                    attempts=attempts,
                    escalated_to=escalated_to,
                )
            await workflow.sleep(min(interval, remaining))
            interval = min(interval * 2, longest)

    async def _settled(
        self,
        request: ReconcileInput,
        status: Status,
        attempts: int,
        follows_ledger: bool,
        escalated_to: str | None = None,
    ) -> ReconcileResult:
        if follows_ledger:
            workflow.upsert_search_attributes([UNRESOLVED_KEYS.value_unset(), ESCALATED_TO.value_unset()])
        await self._tell_run(request)
        return ReconcileResult(key=request.key, status=status, attempts=attempts, escalated_to=escalated_to)

    async def _watch_ledger(self, request: ReconcileInput, interval: timedelta) -> Status:
        """Past the deadline the hook has had its chance; read the ledger until someone settles it."""
        while True:
            await workflow.sleep(interval)
            settled = await workflow.execute_activity_method(
                LedgerActivities.settle_call,
                SettleInput(tenant=request.tenant, signal=ResolveSignal(key=request.key, actor="reconciler")),
                start_to_close_timeout=LEDGER_STEP_TIMEOUT,
                retry_policy=LEDGER_RETRY,
                summary=f"read {request.key}",
            )
            status = Status(settled.outcome.status)
            if status is not Status.INDETERMINATE and status is not Status.STARTED:
                return status
            if workflow.info().is_continue_as_new_suggested():
                # A call unknown for weeks: start afresh, already past the deadline and escalated.
                workflow.continue_as_new(
                    request.model_copy(update={"deadline_seconds": 0.0, "escalation_owner": None})
                )

    async def _escalate(self, request: ReconcileInput) -> str | None:
        """Name the policy's owner on the record, in an event and in search attributes."""
        owner = request.escalation_owner
        if not owner:
            return None
        await workflow.execute_activity_method(
            LedgerActivities.escalate_call,
            EscalateInput(
                key=request.key,
                owner=owner,
                reason=f"still unknown after the reconcile deadline ({request.deadline_seconds:g}s)",
            ),
            start_to_close_timeout=LEDGER_STEP_TIMEOUT,
            retry_policy=LEDGER_RETRY,
            summary=f"escalate {request.key} to {owner}",
        )
        workflow.upsert_search_attributes([ESCALATED_TO.value_set(owner), TENANT.value_set(request.tenant)])
        handle = workflow.get_external_workflow_handle(request.run_id)
        try:
            await handle.signal("escalated", EscalatedSignal(key=request.key, owner=owner))
        except Exception as err:  # the run may have ended; the ledger and this workflow say it
            workflow.logger.info("run %s was not told of the escalation: %s", request.run_id, err)
        return owner

    async def _tell_run(self, request: ReconcileInput) -> None:
        handle = workflow.get_external_workflow_handle(request.run_id)
        try:
            await handle.signal("resolve", ResolveSignal(key=request.key, actor="reconciler"))
        except Exception as err:  # the run may have ended; the ledger already holds the answer
            workflow.logger.info("run %s was not told about %s: %s", request.run_id, request.key, err)
