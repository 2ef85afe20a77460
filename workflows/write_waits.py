"""The waits of a write call: nothing is sent while the run waits.

For an operator's approval, for a guard to let a held call go, for an unknown call to be settled
(by its reconciler, an operator, or the run's own timer when there is nothing to poll), and the
escalation at the reconcile deadline. Every wait also re-reads the ledger on a timer, since a signal
can be lost. Deterministic code only: a layer of WriteCalls, run inside the hosting workflow.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from onceflow.activities.ledger_steps import LedgerActivities
    from onceflow.ledger.status import Status
    from onceflow.runtime.constants import (
        ERR_CALL_INDETERMINATE,
        HOLD_RECHECK_INITIAL,
        LEDGER_RETRY,
        LEDGER_STEP_TIMEOUT,
    )
    from onceflow.sdk.payloads import (
        AgentSpec,
        CallRef,
        EscalateInput,
        ExpireApprovalInput,
        Phase,
        ResolveSignal,
        ToolCallInput,
        ToolOutcome,
        ToolSpec,
    )

from onceflow.workflows.write_sends import WriteSends
from onceflow.workflows.write_state import call_summary, wait_until

# An unknown call with nothing to poll (no reconcile hook, no receiver dedup window) in a run that
# pauses waits on the run's own timer: no ReconcileWorkflow. The run re-reads the ledger on the
# reconcile backoff and escalates at the deadline itself. Runs started before it replay without it.
PATCH_WAIT_WITHOUT_RECONCILER = "wait-without-reconciler"


def nothing_to_poll(tool: ToolSpec) -> bool:
    """A reconciler would only read the ledger for this tool: no hook to ask, no window to resend in.
    (A spec from before `has_dedup_window` existed says None: it may have one.)"""
    return not tool.has_reconcile and tool.has_dedup_window is False


class WriteWaits(WriteSends):
    """Approval, held, awaiting reconciliation, the run's own wait, escalation."""

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
            nudged = remaining > 0 and await wait_until(lambda: ref.key in self._nudged, wait)
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
            await wait_until(lambda: ref.key in self._nudged, wait)
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
        ref = CallRef(key=key, tool=tool.name, tool_call_id=key.rpartition(":")[2])
        found = await self._inspect_once(ref)
        if found is not None and found.status is Status.STARTED:
            return  # its owner's lease is live: it may be on the wire; asked again next round
        self._adopted.add(key)
        if found is not None and found.status is Status.INDETERMINATE:
            await self._start_reconcile(spec, tool, ref)

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
        alone = (
            not failing
            and self._recheck
            and nothing_to_poll(tool)
            and (self._current or workflow.patched(PATCH_WAIT_WITHOUT_RECONCILER))
        )
        if not alone:
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
        if alone:
            await self._wait_alone(spec, ref)
        while ref.key not in self._resolved:
            if not await wait_until(lambda: ref.key in self._resolved, recheck):
                # Nothing told us for a while; the ledger may know anyway (a lost signal, a late
                # owner's answer, a reconciler past its deadline and an operator after it).
                await self._settle(ResolveSignal(key=ref.key, actor="run"), source="recheck")
        resolved = self._resolved.pop(ref.key)
        self._leave_pending(ref.key)
        return resolved

    async def _wait_alone(self, spec: AgentSpec, ref: CallRef) -> None:
        """What the reconciler did for a call with nothing to poll, on this run's timer: re-read the
        ledger on the reconcile backoff (capped by the recheck interval) until someone settles the
        call, and escalate it to the policy's owner once the reconcile deadline has passed."""
        policy = spec.policy
        deadline = workflow.now() + timedelta(seconds=policy.reconcile_deadline_seconds)
        interval = policy.reconcile_initial_interval_seconds
        escalated = False
        while ref.key not in self._resolved:
            remaining = (deadline - workflow.now()).total_seconds()
            if remaining <= 0 and not escalated:
                escalated = True
                await self._escalate(spec, ref)
                continue
            wait = min(interval, policy.recheck_interval_seconds)
            if not escalated:
                wait = min(wait, remaining)
            if not await wait_until(lambda: ref.key in self._resolved, wait):
                await self._settle(ResolveSignal(key=ref.key, actor="run"), source="recheck")
            interval = min(interval * 2, policy.reconcile_max_interval_seconds)

    async def _escalate(self, spec: AgentSpec, ref: CallRef) -> None:
        """Name the policy's owner on the record (and its event) and on this run, as a reconciler
        past its deadline does."""
        policy = spec.policy
        owner = policy.escalation_owner
        if not owner:
            return
        await workflow.execute_activity_method(
            LedgerActivities.escalate_call,
            EscalateInput(
                key=ref.key,
                owner=owner,
                reason=f"still unknown after the reconcile deadline ({policy.reconcile_deadline_seconds:g}s)",
            ),
            start_to_close_timeout=LEDGER_STEP_TIMEOUT,
            retry_policy=LEDGER_RETRY,
            summary=f"escalate {ref.key} to {owner}",
        )
        if ref.key in self._pending and ref.key not in self._resolved:
            self._escalated[ref.key] = owner
            self._publish_escalations()
