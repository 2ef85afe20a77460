"""The write protocol of one call, as AgentRunWorkflow runs it.

Send once (the ledger reserves first), ask the ledger when an attempt was lost, and wait: for an
operator's approval, for a guard to let a held call go, for an unknown call to be settled. Every wait
also re-reads the ledger on a timer, since a signal can be lost. Deterministic code only: it runs
inside the workflow, as a base class of AgentRunWorkflow, whose state it shares.

WriteCalls is built in layers, one module each: write_state.py (the state and what the Temporal UI
shows of it, `wait_until`, `call_summary`), write_sends.py (send once, inspect, settle, start a
reconciler), write_waits.py (approval, held, awaiting reconciliation, the run's own wait for a call
with nothing to poll, escalation), and here the order one call goes through them. The names other
modules import from here stay importable from here.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from onceflow.ledger.status import Status
    from onceflow.sdk.keys import call_key
    from onceflow.sdk.payloads import (
        AgentSpec,
        CallRef,
        CallSummary,
        ToolCallInput,
        ToolOutcome,
        ToolSpec,
    )

from onceflow.workflows.write_state import call_summary, wait_until
from onceflow.workflows.write_waits import PATCH_WAIT_WITHOUT_RECONCILER, WriteWaits, nothing_to_poll

__all__ = ["PATCH_WAIT_WITHOUT_RECONCILER", "WriteCalls", "call_summary", "nothing_to_poll", "wait_until"]


class WriteCalls(WriteWaits):
    """The per-call write protocol and the run's waits, with the state they share."""

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
