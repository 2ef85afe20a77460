"""CompensationWorkflow: undo one completed call, once, because an operator asked.

Started only by the operator API (id `compensation:<key>`, so asking twice while it runs starts it
once), which first writes a `compensation_requested` event on the call; planning claims that request
for this run, and the operator recorded on the call is the request's, never the input's. A run
started by hand has no request to claim and fails (`CompensationNotRequested`) before anything is
reserved or sent. Nothing in the runtime starts it on its own: not a failed, cancelled, timed-out or reset run.
The compensation is a single-attempt write with its own key, `<key>:compensation`. If its outcome is
unknown, it waits, like any unknown call, for an operator's `resolve` (to the compensation key);
the API passes that resolve to this workflow.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from onceflow.activities.compensation import CompensationActivities
    from onceflow.activities.ledger_steps import LedgerActivities
    from onceflow.ledger.status import Status
    from onceflow.runtime.constants import (
        ACTIVITY_MARGIN,
        ERR_LEDGER_UNAVAILABLE,
        ERR_OUTCOME_NOT_RECORDED,
        LEDGER_RETRY,
        LEDGER_STEP_TIMEOUT,
        PHASE,
        RESERVE_BACKOFF_INITIAL,
        RESERVE_BACKOFF_MAX,
        TENANT,
        UNRESOLVED_KEYS,
        WRITE_ONCE,
    )
    from onceflow.sdk.payloads import (
        CallRef,
        CompensationInput,
        CompensationPlan,
        CompensationResult,
        OwnerOutcome,
        Phase,
        ResolveSignal,
        ToolOutcome,
    )

from onceflow.workflows.write_state import wait_until, with_unsent_owner

# The compensation activity lost before it reserved anything is run again at most this often.
_MAX_UNRESERVED_RERUNS = 3
# An unknown compensation re-reads the ledger on a timer (the agent's recheck_interval), not only when
# nudged. Runs started before it replay without the timer.
PATCH_COMPENSATION_RECHECK = "compensation-recheck"
# The compensation ran and only its outcome's write failed: the outcome is recorded by a retrying
# ledger step instead of being looked for. Runs from before replay the inspection they made.
PATCH_COMPENSATION_OUTCOME = "compensation-outcome-not-recorded"
# The compensation met the ledger away and sent nothing: it is reserved again after a while, naming
# the attempt's owner token, instead of being looked for. Runs from before replay the inspection.
PATCH_COMPENSATION_LEDGER_AWAY = "compensation-ledger-away"


def compensation_workflow_id(key: str) -> str:
    return f"compensation:{key}"


@workflow.defn
class CompensationWorkflow:
    def __init__(self) -> None:
        self._nudged = False
        self._recheck = False

    @workflow.signal
    def resolve(self, signal: ResolveSignal) -> None:
        """Someone settled the compensation call in the ledger: read it again."""
        self._nudged = True

    @workflow.run
    async def run(self, request: CompensationInput) -> CompensationResult:
        self._recheck = workflow.patched(PATCH_COMPENSATION_RECHECK)
        workflow.upsert_search_attributes(
            [PHASE.value_set(Phase.RUNNING.value), TENANT.value_set(request.tenant)]
        )
        plan: CompensationPlan = await workflow.execute_activity_method(
            CompensationActivities.plan_compensation,
            request,
            start_to_close_timeout=LEDGER_STEP_TIMEOUT,
            retry_policy=LEDGER_RETRY,
            summary=f"check {request.key} can be compensated",
        )
        outcome = await self._compensate_once(request, plan)
        while outcome.status in (Status.STARTED, Status.INDETERMINATE):
            outcome = await self._await_resolution(plan, outcome)
        original = await workflow.execute_activity_method(
            CompensationActivities.finish_compensation,
            request,
            start_to_close_timeout=LEDGER_STEP_TIMEOUT,
            retry_policy=LEDGER_RETRY,
            summary=f"record the outcome on {request.key}",
        )
        workflow.upsert_search_attributes(
            [PHASE.value_set(Phase.COMPLETED.value), UNRESOLVED_KEYS.value_unset()]
        )
        return CompensationResult(
            key=request.key,
            compensation_key=plan.compensation_key,
            status=Status(outcome.status),
            original_status=Status(original.status),
            value=outcome.value,
        )

    async def _compensate_once(self, request: CompensationInput, plan: CompensationPlan) -> ToolOutcome:
        ref = CallRef(key=plan.compensation_key, tool=plan.hook, tool_call_id=plan.compensation_key)
        backoff = RESERVE_BACKOFF_INITIAL
        unexpected = 0
        while True:
            began = workflow.now()
            try:
                outcome: ToolOutcome = await workflow.execute_activity_method(
                    CompensationActivities.run_compensation,
                    request,
                    start_to_close_timeout=timedelta(seconds=plan.timeout_seconds) + ACTIVITY_MARGIN,
                    retry_policy=WRITE_ONCE,
                    summary=f"{plan.hook} {plan.compensation_key}",
                )
                return outcome
            except ActivityError as err:
                cause = err.cause
                if (
                    isinstance(cause, ApplicationError)
                    and cause.type == ERR_LEDGER_UNAVAILABLE
                    and workflow.patched(PATCH_COMPENSATION_LEDGER_AWAY)
                ):
                    # Nothing was sent. Reserve again once the ledger may be back; a reservation
                    # that committed while its answer was lost is known by its owner token.
                    request = with_unsent_owner(request, cause)
                    workflow.set_current_details(f"ledger unavailable; will reserve {ref.key} again")
                    await workflow.sleep(backoff)
                    backoff = min(backoff * 2, RESERVE_BACKOFF_MAX)
                    continue
                if (
                    isinstance(cause, ApplicationError)
                    and cause.type == ERR_OUTCOME_NOT_RECORDED
                    and workflow.patched(PATCH_COMPENSATION_OUTCOME)
                ):
                    recorded: ToolOutcome = await workflow.execute_activity_method(
                        LedgerActivities.record_outcome,
                        OwnerOutcome.model_validate(cause.details[0]),
                        start_to_close_timeout=LEDGER_STEP_TIMEOUT,
                        retry_policy=LEDGER_RETRY,
                        summary=f"record outcome {ref.key}",
                    )
                    return recorded
                if request.unsent_owners:  # a reservation of theirs was never sent
                    ref = ref.model_copy(update={"unsent_owners": request.unsent_owners})
                found = await workflow.execute_activity_method(
                    LedgerActivities.inspect_call,
                    ref,
                    start_to_close_timeout=LEDGER_STEP_TIMEOUT,
                    retry_policy=LEDGER_RETRY,
                    summary=f"inspect {ref.key}",
                )
                if found is not None:
                    return found
                unexpected += 1
                if unexpected > _MAX_UNRESERVED_RERUNS:
                    raise ApplicationError(
                        f"compensation of {request.key} could not be reserved",
                        type="CompensationBroken",
                        non_retryable=True,
                    ) from err
                workflow.logger.warning("compensation of %s not reserved (%s); again", request.key, err)
                # No row: nothing was reserved, so nothing was sent, and running it again is safe
                # (the ledger guards the key). Unless a failover of the ledger lost the row: the next
                # attempt is told when this one began, and runs nothing if the ledger failed over
                # since (as a write call's next attempt is, workflows/write_sends.py).
                if request.lost_attempt_at is None:
                    request = request.model_copy(update={"lost_attempt_at": began})

    async def _await_resolution(self, plan: CompensationPlan, outcome: ToolOutcome) -> ToolOutcome:
        workflow.upsert_search_attributes(
            [
                PHASE.value_set(Phase.AWAITING_RECONCILIATION.value),
                UNRESOLVED_KEYS.value_set([plan.compensation_key]),
            ]
        )
        workflow.set_current_details(
            f"The compensation {plan.compensation_key} is {outcome.status}: an operator must find out "
            "whether it took effect and resolve it."
        )
        if self._recheck:
            # Re-read on a timer too: a lost nudge, or the owner's late answer, must not leave the
            # compensation settled in the ledger and the original never marked compensated.
            await wait_until(lambda: self._nudged, plan.recheck_interval_seconds)
        else:
            await workflow.wait_condition(lambda: self._nudged)
        self._nudged = False
        ref = CallRef(key=plan.compensation_key, tool=plan.hook, tool_call_id=plan.compensation_key)
        found: ToolOutcome | None = await workflow.execute_activity_method(
            LedgerActivities.inspect_call,
            ref,
            start_to_close_timeout=LEDGER_STEP_TIMEOUT,
            retry_policy=LEDGER_RETRY,
            summary=f"read {ref.key}",
        )
        return found or outcome
