"""A run id names one run forever: claimed in the ledger by the run's first write, refused to any
other workflow execution after that, whoever started it and however long ago Temporal forgot the
first run. And a run id keys can be built from unambiguously: no `:`.

Before, only the start helper's REJECT_DUPLICATE stood in the way, and only while Temporal still
knew the first run: a second execution under the same id was handed the first run's recorded
results under its keys (nothing sent, but the wrong answer), or sent again where a row was gone.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.common import WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from onceflow.activities.held import wake_held
from onceflow.ledger import CallIdentity, EventSource, Guard, Ledger, Reservation, SideEffect, Status
from onceflow.ledger.run_ids import RunIds, RunIdTakenError
from onceflow.runtime.client import start_run
from onceflow.sdk.keys import InvalidRunIdError
from onceflow.sdk.payloads import AgentRunInput, AgentRunResult, Phase
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.agents import support_registry
from tests.support.downstream import DOWNSTREAM
from tests.support.guarded import REFUND, new_run, refund_arguments, reserve_refund
from tests.workflow_harness import Harness, running_worker

ORDER = json.dumps({"order_id": "o1"})


@pytest.fixture
async def harness(temporal_env: WorkflowEnvironment, ledger: Ledger) -> AsyncIterator[Harness]:
    DOWNSTREAM.reset()
    async with running_worker(temporal_env.client, ledger, support_registry()) as h:
        yield h


def _run_input(agent: str) -> AgentRunInput:
    return AgentRunInput(agent=agent, tenant="acme", input=ORDER, max_turns=20)


async def _raw_start(
    harness: Harness, run_id: str, agent: str = "credit-reconciled"
) -> WorkflowHandle[AgentRunWorkflow, AgentRunResult]:
    """Started the way client code that does not use onceflow's helper might: any reuse allowed."""
    return await harness.client.start_workflow(
        AgentRunWorkflow.run,
        _run_input(agent),
        id=run_id,
        task_queue=harness.task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
    )


async def _failure(handle: WorkflowHandle[Any, Any]) -> str:
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), 30)
    return str(failed.value.cause)


async def _snapshot(ledger: Ledger, run_id: str) -> list[dict[str, Any]]:
    async with ledger.connection("test_snapshot") as conn:
        rows = await conn.fetch(
            "SELECT t.*, (SELECT count(*) FROM tool_execution_events e WHERE e.key = t.key) AS events"
            " FROM tool_executions t WHERE run_id = $1 ORDER BY key",
            run_id,
        )
    return [dict(r) for r in rows]


async def test_a_second_execution_under_a_claimed_run_id_is_refused_and_sends_nothing(
    harness: Harness,
) -> None:
    first = await harness.start("credit-reconciled", ORDER)
    await asyncio.wait_for(first.result(), 30)
    assert DOWNSTREAM.send_attempts == 1
    before = await _snapshot(harness.ledger, first.id)

    second = await _raw_start(harness, first.id)
    why = await _failure(second)

    assert "was claimed by another run" in why, why
    assert DOWNSTREAM.send_attempts == 1
    assert await _snapshot(harness.ledger, first.id) == before


async def _forget(harness: Harness, handle: WorkflowHandle[Any, Any]) -> None:
    """Delete the run from Temporal, as retention eventually does, and wait until it is gone."""
    await harness.client.workflow_service.delete_workflow_execution(
        DeleteWorkflowExecutionRequest(
            namespace=harness.client.namespace, workflow_execution=WorkflowExecution(workflow_id=handle.id)
        )
    )
    for _ in range(900):
        try:
            await harness.client.get_workflow_handle(handle.id).describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return
            raise
        await asyncio.sleep(0.1)
    raise AssertionError(f"{handle.id} is still known to Temporal")


async def test_the_ledger_refuses_a_claimed_run_id_after_temporal_forgot_the_run(harness: Harness) -> None:
    """A run waiting for approval is terminated and deleted from Temporal: the start helper's
    REJECT_DUPLICATE then lets the id through, and the ledger refuses it."""
    first = await harness.start("credit-approval", ORDER)
    key = f"{first.id}:call_1_0"

    async def awaiting() -> None:
        while (await first.query(AgentRunWorkflow.status)).phase != Phase.AWAITING_APPROVAL:
            await asyncio.sleep(0.1)

    await asyncio.wait_for(awaiting(), 30)
    await first.terminate("test: the run goes away")
    await _forget(harness, first)
    before = await _snapshot(harness.ledger, first.id)

    again = await start_run(
        harness.client, _run_input("credit-approval"), run_id=first.id, task_queue=harness.task_queue
    )
    why = await _failure(again)

    assert "was claimed by another run" in why, why
    assert DOWNSTREAM.send_attempts == 0
    assert await _snapshot(harness.ledger, first.id) == before
    assert (await harness.ledger.get(key, with_events=False)).status is Status.AWAITING_APPROVAL


async def test_a_run_id_with_a_colon_is_refused_by_the_helper_and_by_the_first_write(
    harness: Harness,
) -> None:
    run_id = f"a:b-{uuid.uuid4().hex[:6]}"
    with pytest.raises(InvalidRunIdError, match="without `:`"):
        await start_run(
            harness.client, _run_input("credit-reconciled"), run_id=run_id, task_queue=harness.task_queue
        )
    with pytest.raises(RPCError):
        await harness.client.get_workflow_handle(run_id).describe()  # never started

    # Started by hand anyway: the write refuses it, nothing is reserved or sent.
    handle = await _raw_start(harness, run_id)
    why = await _failure(handle)
    assert "invalid run id" in why, why
    assert DOWNSTREAM.send_attempts == 0
    assert await _snapshot(harness.ledger, run_id) == []


async def test_a_claim_holds_for_the_run_that_made_it_and_no_other(ledger: Ledger) -> None:
    claims = RunIds(ledger)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    await claims.claim(run_id, execution="exec-1", tenant="acme")
    await claims.claim(run_id, execution="exec-1", tenant="acme")  # the same run, a later write
    with pytest.raises(RunIdTakenError):
        await claims.claim(run_id, execution="exec-2", tenant="acme")
    # At once, from many connections: exactly one execution wins.
    other = f"run-{uuid.uuid4().hex[:8]}"
    results = await asyncio.gather(
        *(claims.claim(other, execution=f"exec-{i}", tenant="acme") for i in range(8)), return_exceptions=True
    )
    assert sum(r is None for r in results) == 1
    assert all(isinstance(r, RunIdTakenError) for r in results if r is not None)


async def test_a_held_call_wakes_the_run_recorded_for_it_by_exact_match(harness: Harness) -> None:
    """The run of a held call is the one the ledger recorded, not a piece cut out of its key: here a
    held call whose tool call id has a `:` in it (made straight in the ledger), so the key's part
    before its last `:` is not a run at all, while the recorded run is waiting to be told."""
    waiting = await harness.start("credit-approval", ORDER)

    async def awaiting() -> None:
        while (await waiting.query(AgentRunWorkflow.status)).phase != Phase.AWAITING_APPROVAL:
            await asyncio.sleep(0.1)

    await asyncio.wait_for(awaiting(), 30)
    order_id = f"ord_{uuid.uuid4().hex[:6]}"
    blocker = await reserve_refund(harness.ledger, new_run(), "call_1_0", order_id=order_id)
    await harness.ledger.mark_indeterminate(blocker.record.key, actor="inspector", reason="timed out")
    held = await reserve_refund(harness.ledger, waiting.id, "x:y", order_id=order_id)
    assert held.record.status is Status.HELD
    assert held.record.key == f"{waiting.id}:x:y"

    settled = await harness.ledger.settle(
        blocker.record.key,
        status=Status.COMPLETED,
        actor="reconciler",
        reason="found it",
        source=EventSource.RECONCILER,
    )
    told = await wake_held(harness.ledger, settled, harness.client)

    assert told == 1
    await waiting.terminate("test over")


async def test_the_first_write_claims_its_run_id_in_its_reservation_and_a_taken_one_reserves_nothing(
    ledger: Ledger,
) -> None:
    """The claim rides in the reservation's statement (one commit): it is made before the guards
    decide, and a run id another execution holds leaves no row, no event, no claim change."""
    run_id = new_run()
    call = CallIdentity(tenant="acme", run_id=run_id, tool_call_id="call-1", agent="refunds")
    first = await ledger.reserve(
        call,
        tool_name=REFUND,
        side_effect=SideEffect.EXTERNAL,
        arguments=refund_arguments(),
        owner="worker-a",
        guard=Guard(),
        execution="exec-1",
    )
    assert first.outcome is Reservation.NEW
    async with ledger.connection("test_claims") as conn:
        claimed = await conn.fetchrow("SELECT execution, tenant FROM run_ids WHERE run_id = $1", run_id)
    assert (claimed["execution"], claimed["tenant"]) == ("exec-1", "acme")
    before = await _snapshot(ledger, run_id)
    other = call.model_copy(update={"tool_call_id": "call-2"})
    with pytest.raises(RunIdTakenError) as taken:
        await ledger.reserve(
            other,
            tool_name=REFUND,
            side_effect=SideEffect.EXTERNAL,
            arguments=refund_arguments(amount=100),
            owner="worker-b",
            guard=Guard(),
            execution="exec-2",
        )
    assert taken.value.run_id == run_id and taken.value.claimed_at.tzinfo is not None
    assert await _snapshot(ledger, run_id) == before
    # The same execution's later writes pass, with the claim or without it.
    again = await ledger.reserve(
        other,
        tool_name=REFUND,
        side_effect=SideEffect.EXTERNAL,
        arguments=refund_arguments(amount=100),
        owner="worker-a",
        guard=Guard(),
        execution="exec-1",
    )
    assert again.outcome is Reservation.NEW
