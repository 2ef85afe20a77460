"""Through real runs: a resolve signal cannot pass for an operator, and a late owner outcome that
contradicts the decision flags the call and shows on the run's search attributes."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.ledger import CallIdentity, EventSource, Ledger, SideEffect, Status
from onceflow.runtime.constants import CONFLICT_KEYS
from onceflow.sdk.payloads import OwnerOutcome, Phase, ResolveSignal
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.agents import support_registry
from tests.support.downstream import DOWNSTREAM
from tests.support.late_outcome import LateOutcomeInput, RecordLateOutcome
from tests.test_agent_run import wait_for_phase
from tests.workflow_harness import Harness, running_worker


@pytest.fixture
async def harness(temporal_env: WorkflowEnvironment, ledger: Ledger) -> AsyncIterator[Harness]:
    DOWNSTREAM.reset()
    async with running_worker(temporal_env.client, ledger, support_registry()) as h:
        yield h


async def paused_run(harness: Harness) -> tuple[WorkflowHandle[Any, Any], str]:
    order_id = f"o{uuid.uuid4().hex[:8]}"
    DOWNSTREAM.modes[f"acct_{order_id}"] = "hang_after_apply"
    handle = await harness.start("credit-pause", json.dumps({"order_id": order_id}))
    await wait_for_phase(handle, Phase.AWAITING_RECONCILIATION)
    return handle, f"{handle.id}:call_1_0"


async def conflict_keys(handle: WorkflowHandle[Any, Any]) -> Sequence[str] | None:
    return (await handle.describe()).typed_search_attributes.get(CONFLICT_KEYS)


async def test_a_resolve_signal_naming_an_operator_is_recorded_as_the_signal_it_was(
    harness: Harness,
) -> None:
    handle, key = await paused_run(harness)

    await handle.signal(
        AgentRunWorkflow.resolve,
        ResolveSignal(key=key, status="failed", reason="typed in the CLI", actor="operator:alice"),
    )
    await asyncio.wait_for(handle.result(), 20)

    record = await harness.ledger.get(key)
    assert (record.status, record.settled_by) == (Status.FAILED, "signal:alice")
    settled = [e for e in record.events if e.kind == "settled"]
    assert [(e.actor, e.source) for e in settled] == [("signal:alice", EventSource.SIGNAL)]
    assert settled[0].detail == {"claimed_actor": "operator:alice"}
    assert not any(e.actor.startswith("operator:") for e in record.events)


async def open_run_with_a_decided_call(harness: Harness) -> tuple[WorkflowHandle[Any, Any], str]:
    """A run that stays open (its first call waits for approval) and, beside it, one more call of that
    run that timed out and that an operator decided "failed". A run paused on reconciliation would
    not do: its reconciler sees the decision and the run finishes before the late outcome arrives."""
    order_id = f"o{uuid.uuid4().hex[:8]}"
    handle = await harness.start("credit-approval", json.dumps({"order_id": order_id}))
    await wait_for_phase(handle, Phase.AWAITING_APPROVAL)
    call = CallIdentity(tenant="acme", run_id=handle.id, tool_call_id="call_9_0", agent="credit-approval")
    await harness.ledger.reserve(
        call,
        tool_name="issue_credit_approved",
        side_effect=SideEffect.EXTERNAL,
        arguments={"account_id": f"acct_{order_id}", "amount_cents": 100},
        owner="zombie-attempt",
    )
    await harness.ledger.mark_indeterminate(call.key, actor="inspector", reason="timed out")
    await harness.ledger.settle(
        call.key, status=Status.FAILED, actor="operator:alice", reason="not in billing"
    )
    return handle, call.key


async def test_a_late_owner_outcome_against_the_decision_flags_the_call_and_the_run(
    harness: Harness,
) -> None:
    handle, key = await open_run_with_a_decided_call(harness)
    # The owner's answer arrives after all, through the real `record_outcome` step: it completed.
    late = OwnerOutcome(
        key=key,
        owner="zombie-attempt",
        tool="issue_credit_approved",
        tool_call_id="call_9_0",
        status="completed",
        value={"credit_id": "cr_late"},
    )
    helper_queue = f"late-{uuid.uuid4().hex[:8]}"
    request = LateOutcomeInput(outcome=late, task_queue=harness.task_queue)
    async with Worker(harness.client, task_queue=helper_queue, workflows=[RecordLateOutcome]):
        told = await harness.client.execute_workflow(
            RecordLateOutcome.run, request, id=f"late-{uuid.uuid4().hex[:8]}", task_queue=helper_queue
        )
        assert told.status is Status.FAILED  # the decision stands

        record = await harness.ledger.get(key, with_events=False)
        assert record.has_conflict and record.status is Status.FAILED
        for _ in range(100):
            if await conflict_keys(handle) == [key]:
                break
            await asyncio.sleep(0.05)
        assert await conflict_keys(handle) == [key]

        # A closed run cannot take the signal: the step still succeeds, and adds no second event.
        await handle.terminate("test over")
        again = await harness.client.execute_workflow(
            RecordLateOutcome.run, request, id=f"late-{uuid.uuid4().hex[:8]}", task_queue=helper_queue
        )
        assert again.status is Status.FAILED
    events = (await harness.ledger.get(key)).events
    assert [e.kind for e in events].count("outcome_conflict") == 1
    assert (await harness.ledger.get(key, with_events=False)).has_conflict
