"""The write protocol of one call, as AgentRunWorkflow runs it.

Send once (the ledger reserves first), ask the ledger when an attempt was lost, and wait: for an
operator's approval, for a guard to let a held call go, for an unknown call to be settled. Every wait
also re-reads the ledger on a timer, since a signal can be lost. Deterministic code only: it runs
inside the workflow, as a base class of AgentRunWorkflow, whose state it shares.
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
        ERR_CALL_INDETERMINATE,
        ERR_INVALID_RUN_ID,
        ERR_LEDGER_UNAVAILABLE,
        ERR_OUTCOME_NOT_RECORDED,
        ERR_PAYLOAD_MISMATCH,
        ERR_RUN_ID_TAKEN,
        ERR_TENANT_MISMATCH,
        ESCALATED_TO,
        HELD_KEYS,
        HOLD_RECHECK_INITIAL,
        LEDGER_RETRY,
        LEDGER_STEP_TIMEOUT,
        PHASE,
        RESERVE_BACKOFF_INITIAL,
        RESERVE_BACKOFF_MAX,
        UNRESOLVED_KEYS,
        WRITE_ONCE,
    )
    from onceflow.sdk.keys import call_key
    from onceflow.sdk.payloads import (
        AgentSpec,
        CallRef,
        CallSummary,
        ExpireApprovalInput,
        OwnerOutcome,
        Phase,
        ReconcileInput,
        ResolveSignal,
        SettleInput,
        SettleResult,
        ToolCallInput,
        ToolOutcome,
        ToolSpec,
    )
    from onceflow.workflows.reconcile import ReconcileWorkflow, reconcile_workflow_id

# A write activity that failed in an unexpected way before reserving is run again at most this often.
_MAX_UNRESERVED_RERUNS = 3


class WriteCalls:
    """The per-call write protocol and the run's waits, with the state they share."""

    def __init__(self) -> None:
        self._phase = Phase.RUNNING
        self._tenant = ""
        self._calls: dict[str, CallSummary] = {}
        self._pending: dict[str, CallSummary] = {}
        self._resolved: dict[str, ToolOutcome] = {}
        self._last_resolve_error: str | None = None
        self._nudged: set[str] = set()
        self._escalated: dict[str, str] = {}
        # Decided once, on the first workflow task, so a run keeps one behaviour for its whole life.
        self._recheck = False
        self._attributes_follow_ledger = False
        self._held: set[str] = set()
        self._adopted: set[str] = set()

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

    # -- writes: the per-call protocol --------------------------------------------------------------

    async def _call_write(self, spec: AgentSpec, tool: ToolSpec, tool_input: ToolCallInput) -> ToolOutcome:
        call = tool_input.call
        ref = CallRef(key=call_key(tool_input.run_id, call.id), tool=call.name, tool_call_id=call.id)
        self._calls[call.id] = CallSummary(
            tool_call_id=call.id, tool=call.name, key=ref.key, status="started"
        )
        outcome = await self._send_once(tool, tool_input, ref)
        if outcome.status is Status.HELD:
            outcome = await self._await_release(spec, tool, tool_input, ref, outcome)
        if outcome.status is Status.AWAITING_APPROVAL:
            outcome = await self._await_approval(spec, tool, tool_input, ref, outcome)
        if outcome.status is Status.STARTED:  # another attempt holds it: that is unknown, not failed
            outcome = await self._inspect(ref) or outcome
        if outcome.status is Status.INDETERMINATE:
            outcome = await self._await_resolution(spec, tool, ref, outcome)
        return outcome

    async def _send_once(self, tool: ToolSpec, tool_input: ToolCallInput, ref: CallRef) -> ToolOutcome:
        """Run the write activity; if it was lost, let the ledger say what happened."""
        backoff = RESERVE_BACKOFF_INITIAL
        unexpected = 0
        while True:
            try:
                return await workflow.execute_activity_method(
                    ToolActivities.run_write_tool,
                    tool_input,
                    start_to_close_timeout=timedelta(seconds=tool.timeout_seconds) + ACTIVITY_MARGIN,
                    retry_policy=WRITE_ONCE,
                    summary=f"{ref.tool} {ref.key}",
                )
            except ActivityError as err:
                cause = err.cause
                kind = cause.type if isinstance(cause, ApplicationError) else None
                if kind in (ERR_LEDGER_UNAVAILABLE, ERR_BUDGET_LIMIT_UNAVAILABLE):
                    # Nothing was sent. Retry the reservation, never the tool; a recorded call whose
                    # budget limit could not be read stays as the ledger has it meanwhile.
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
                found = await self._inspect(ref)
                if found is not None:
                    return found
                # No row: nothing was reserved, so nothing was sent; it is safe to run it.
                if not isinstance(cause, TemporalTimeoutError):
                    unexpected += 1
                    if unexpected > _MAX_UNRESERVED_RERUNS:
                        raise ApplicationError(
                            f"write {ref.key} failed before reserving, {unexpected} times: {cause}",
                            type="WriteActivityBroken",
                            non_retryable=True,
                        ) from err

    async def _inspect(self, ref: CallRef) -> ToolOutcome | None:
        return await workflow.execute_activity_method(
            LedgerActivities.inspect_call,
            ref,
            start_to_close_timeout=LEDGER_STEP_TIMEOUT,
            retry_policy=LEDGER_RETRY,
            summary=f"inspect {ref.key}",
        )

    async def _await_approval(
        self, spec: AgentSpec, tool: ToolSpec, tool_input: ToolCallInput, ref: CallRef, outcome: ToolOutcome
    ) -> ToolOutcome:
        """The call is recorded `awaiting_approval` and nothing was sent. Wait for an operator.

        Each approve or deny reaches the run as a `resolve` signal; the run then asks the ledger by
        reserving again, which dispatches the call only if it was approved. At the approval deadline
        the call is denied, unless an operator decided first.
        """
        deadline = workflow.now() + timedelta(seconds=spec.policy.approval_deadline_seconds)
        self._pending[ref.key] = call_summary(outcome)
        self._calls[ref.tool_call_id] = call_summary(outcome)
        self._publish_unresolved()
        self._set_phase(Phase.AWAITING_APPROVAL)
        workflow.set_current_details(
            f"Waiting for an operator to approve or deny {ref.key} ({ref.tool}) before it is sent."
        )
        recheck = spec.policy.recheck_interval_seconds if self._recheck else None
        while outcome.status is Status.AWAITING_APPROVAL:
            remaining = (deadline - workflow.now()).total_seconds()
            wait = min(remaining, recheck) if recheck else remaining
            nudged = remaining > 0 and await self._wait_for_nudge(ref.key, wait)
            # A recheck before the deadline asks the ledger as a nudge would (the signal may be lost).
            nudged = nudged or (remaining > wait)
            self._nudged.discard(ref.key)
            if not nudged:
                outcome = await workflow.execute_activity_method(
                    LedgerActivities.expire_approval,
                    ExpireApprovalInput(
                        key=ref.key,
                        tenant=self._tenant,
                        reason=f"no decision within the approval deadline "
                        f"({spec.policy.approval_deadline_seconds:g}s)",
                    ),
                    start_to_close_timeout=LEDGER_STEP_TIMEOUT,
                    retry_policy=LEDGER_RETRY,
                    summary=f"approval deadline for {ref.key}",
                )
                if outcome.status is not Status.AWAITING_APPROVAL:
                    break
                # Approved just before the deadline: dispatch it.
            outcome = await self._send_once(tool, tool_input, ref)
        self._leave_pending(ref.key)
        return outcome

    async def _await_release(
        self, spec: AgentSpec, tool: ToolSpec, tool_input: ToolCallInput, ref: CallRef, outcome: ToolOutcome
    ) -> ToolOutcome:
        """A guard holds the call behind another one (same intent, or same entity); nothing was sent.

        The run asks the ledger again, by reserving again, when nudged (whoever settles the call it
        waits for sends a `resolve` signal without a status; so does the API's nudge) and on a timer,
        1 s doubling up to `tool_policy.recheck_interval`, in case a nudge is lost. The ledger
        decides, in its own transaction, when it may go.
        """
        self._held.add(ref.key)
        self._publish_held()
        wait = HOLD_RECHECK_INITIAL.total_seconds()
        while outcome.status is Status.HELD:
            # A call of this very run: the run part of its key is exactly this run id (run ids
            # have no `:`), not merely a prefix of it.
            if outcome.held_by and outcome.held_by.rpartition(":")[0] == tool_input.run_id:
                await self._adopt(spec, tool, outcome.held_by)
            self._pending[ref.key] = call_summary(outcome)
            self._calls[ref.tool_call_id] = call_summary(outcome)
            self._publish_unresolved()
            self._set_phase(Phase.HELD)
            workflow.set_current_details(f"{ref.key} ({ref.tool}) is held, not sent: {outcome.error}")
            await self._wait_for_nudge(ref.key, wait)
            self._nudged.discard(ref.key)
            wait = min(wait * 2, spec.policy.recheck_interval_seconds)
            outcome = await self._send_once(tool, tool_input, ref)
        self._held.discard(ref.key)
        self._publish_held()
        self._leave_pending(ref.key)
        return outcome

    async def _adopt(self, spec: AgentSpec, tool: ToolSpec, key: str) -> None:
        """A call of this run that this run does not know holds a call of it: one made before a
        Temporal reset, whose activity went with the old run. Nobody else looks after it, so this run
        does, once: if its owner is gone it becomes unknown, and an unknown call gets its reconciler.
        (The same intent means the same tool; nothing else of this run can hold it.)"""
        if key in self._adopted or key in self._calls_by_key():
            return
        self._adopted.add(key)
        ref = CallRef(key=key, tool=tool.name, tool_call_id=key.rpartition(":")[2])
        found = await self._inspect(ref)
        if found is not None and found.status is Status.INDETERMINATE:
            await self._start_reconcile(spec, tool, ref)

    async def _wait_for_nudge(self, key: str, timeout_seconds: float) -> bool:
        try:
            await workflow.wait_condition(lambda: key in self._nudged, timeout=timeout_seconds)
        except TimeoutError:
            return False
        return True

    async def _await_resolution(
        self, spec: AgentSpec, tool: ToolSpec, ref: CallRef, outcome: ToolOutcome
    ) -> ToolOutcome:
        """Unknown: raise it, start reconciling, then pause for the ledger's answer or fail the run."""
        self._calls[ref.tool_call_id] = call_summary(outcome)
        failing = spec.policy.on_indeterminate == "fail"
        if not (failing and self._attributes_follow_ledger):
            # A run that is about to close does not list the key: its reconciler does, while open.
            self._pending[ref.key] = call_summary(outcome)
            self._publish_unresolved()
        await self._start_reconcile(spec, tool, ref)
        if failing:
            raise ApplicationError(
                f"tool call {ref.key} ({ref.tool}) is indeterminate: {outcome.error}. "
                "The run stops here (on_indeterminate: fail); the call stays in the ledger for "
                "a reconcile hook or an operator to settle.",
                type=ERR_CALL_INDETERMINATE,
                non_retryable=True,
            )
        self._set_phase(Phase.AWAITING_RECONCILIATION)
        workflow.set_current_details(
            f"Waiting for {ref.key} ({ref.tool}) to be settled by its reconcile hook or an operator "
            "(send a `resolve` signal or update)."
        )
        recheck = spec.policy.recheck_interval_seconds if self._recheck else None
        while ref.key not in self._resolved:
            if recheck is None:
                await workflow.wait_condition(lambda: ref.key in self._resolved)
            elif not await self._wait_for_resolution(ref.key, recheck):
                # Nothing told us for a while; the ledger may know anyway (a lost signal, a late
                # owner's answer, a reconciler past its deadline and an operator after it).
                await self._settle(ResolveSignal(key=ref.key, actor="run"), source="recheck")
        resolved = self._resolved.pop(ref.key)
        self._leave_pending(ref.key)
        return resolved

    async def _wait_for_resolution(self, key: str, timeout_seconds: float) -> bool:
        try:
            await workflow.wait_condition(lambda: key in self._resolved, timeout=timeout_seconds)
        except TimeoutError:
            return False
        return True

    def _leave_pending(self, key: str) -> None:
        """The ledger settled `key`: it leaves the run's unresolved keys, and its escalation."""
        del self._pending[key]
        self._publish_unresolved()
        if self._attributes_follow_ledger and self._escalated.pop(key, None) is not None:
            self._publish_escalations()
        if not self._pending:
            self._set_phase(Phase.RUNNING)
            workflow.set_current_details("")

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

    # -- what the Temporal UI shows -----------------------------------------------------------------

    def _set_phase(self, phase: Phase) -> None:
        self._phase = phase
        workflow.upsert_search_attributes([PHASE.value_set(phase.value)])

    def _publish_unresolved(self) -> None:
        keys = sorted(self._pending)
        workflow.upsert_search_attributes(
            [UNRESOLVED_KEYS.value_set(keys) if keys else UNRESOLVED_KEYS.value_unset()]
        )

    def _publish_held(self) -> None:
        keys = sorted(self._held)
        workflow.upsert_search_attributes([HELD_KEYS.value_set(keys) if keys else HELD_KEYS.value_unset()])

    def _publish_escalations(self) -> None:
        owners = sorted(set(self._escalated.values()))
        workflow.upsert_search_attributes(
            [ESCALATED_TO.value_set(", ".join(owners)) if owners else ESCALATED_TO.value_unset()]
        )

    def _calls_by_key(self) -> dict[str, CallSummary]:
        return {c.key: c for c in self._calls.values() if c.key}


def call_summary(outcome: ToolOutcome) -> CallSummary:
    status = outcome.status.value if isinstance(outcome.status, Status) else outcome.status
    return CallSummary(
        tool_call_id=outcome.tool_call_id,
        tool=outcome.tool,
        key=outcome.key,
        status=status,
        detail=outcome.error,
    )
