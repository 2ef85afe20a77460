"""The runtime never undoes anything by itself. A completed call stays completed when its run fails,
is cancelled, times out or is reset: compensation happens only when an operator asks (the API)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger, Status
from onceflow.runtime.agents import Agent, AgentConfig, AgentRegistry
from onceflow.runtime.client import start_run
from onceflow.sdk.payloads import AgentRunInput, CompensationInput, Phase
from onceflow.workflows.compensation import CompensationWorkflow, compensation_workflow_id
from tests.support.downstream import DOWNSTREAM, toolset
from tests.support.history import history_events, reset_run, workflow_task_completed_after
from tests.test_agent_run import wait_for_phase
from tests.workflow_harness import Harness, running_worker

# Credit the order's account (undoable, completes), then a second account whose credit hangs.
SCRIPT = [
    {
        "tool_calls": [
            {
                "name": "issue_credit_undoable",
                "arguments": {"account_id": "acct_{{ input.order_id }}", "amount_cents": 100},
            }
        ]
    },
    {
        "tool_calls": [
            {
                "name": "issue_credit_unreconciled",
                "arguments": {"account_id": "acct_hangs", "amount_cents": 200},
            }
        ]
    },
    {"final": "done"},
]


def two_writes(name: str, on_indeterminate: str) -> Agent:
    config = AgentConfig.model_validate(
        {
            "model": {"provider": "scripted", "script": SCRIPT},
            "toolsets": ["test-billing"],
            "tool_policy": {"on_indeterminate": on_indeterminate, "reconcile_deadline": "30s"},
        }
    )
    return Agent(name, config, {t.name: t for t in toolset.tools})


@pytest.fixture
async def harness(temporal_env: WorkflowEnvironment, ledger: Ledger) -> AsyncIterator[Harness]:
    DOWNSTREAM.reset()
    DOWNSTREAM.modes["acct_hangs"] = "hang_after_apply"
    registry = AgentRegistry(
        {a.name: a for a in (two_writes("then-fail", "fail"), two_writes("then-pause", "pause"))}
    )
    async with running_worker(temporal_env.client, ledger, registry) as h:
        yield h


async def assert_nothing_compensated(harness: Harness, key: str) -> None:
    record = await harness.ledger.get(key)
    assert record.status is Status.COMPLETED
    assert DOWNSTREAM.voids == {}
    assert await harness.ledger.find(f"{key}:compensation") is None
    with pytest.raises(RPCError):
        await harness.client.get_workflow_handle(compensation_workflow_id(key)).describe()


def payload() -> str:
    return json.dumps({"order_id": f"o{uuid.uuid4().hex[:6]}"})


async def test_a_failed_run_keeps_its_completed_call(harness: Harness) -> None:
    handle = await harness.start("then-fail", payload())
    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), 30)
    await assert_nothing_compensated(harness, f"{handle.id}:call_0_0")


async def test_a_cancelled_run_keeps_its_completed_call(harness: Harness) -> None:
    handle = await harness.start("then-pause", payload())
    await wait_for_phase(handle, Phase.AWAITING_RECONCILIATION)
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), 30)
    await assert_nothing_compensated(harness, f"{handle.id}:call_0_0")


async def test_a_timed_out_run_keeps_its_completed_call(harness: Harness) -> None:
    handle = await harness.client.start_workflow(
        "AgentRunWorkflow",
        AgentRunInput(agent="then-pause", tenant="acme", input=payload()),
        id=f"run-{uuid.uuid4().hex[:10]}",
        task_queue=harness.task_queue,
        execution_timeout=timedelta(seconds=4),
    )
    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), 30)
    await assert_nothing_compensated(harness, f"{handle.id}:call_0_0")


async def test_a_reset_run_keeps_its_completed_call(harness: Harness) -> None:
    handle = await start_run(
        harness.client,
        AgentRunInput(agent="then-fail", tenant="acme", input=payload()),
        run_id=f"run-{uuid.uuid4().hex[:10]}",
        task_queue=harness.task_queue,
    )
    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), 30)
    first_run = handle.result_run_id
    assert first_run is not None
    events = await history_events(harness.client, handle.id, first_run)
    new_run_id = await reset_run(
        harness.client,
        handle.id,
        first_run,
        workflow_task_completed_after(events, 0),
        "test: replay from the start",
        reapply_signals=False,
    )
    reset = harness.client.get_workflow_handle(handle.id, run_id=new_run_id)
    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(reset.result(), 30)
    key = f"{handle.id}:call_0_0"
    await assert_nothing_compensated(harness, key)
    assert DOWNSTREAM.received[key] == DOWNSTREAM.effects[key] == 1  # the reset sent nothing again


# -- only the operator API starts a compensation ---------------------------------------------------


async def _completed_call(harness: Harness) -> str:
    handle = await harness.start("then-fail", payload())
    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), 30)
    return f"{handle.id}:call_0_0"


async def _compensate_by_hand(harness: Harness, key: str, actor: str) -> WorkflowHandle[Any, Any]:
    return await harness.client.start_workflow(
        CompensationWorkflow.run,
        CompensationInput(key=key, tenant="acme", actor=actor, reason="I say so"),
        id=compensation_workflow_id(key),
        task_queue=harness.task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
    )


def _failure_type(error: WorkflowFailureError) -> str | None:
    cause: BaseException | None = error.cause
    while cause is not None:
        if isinstance(cause, ApplicationError) and cause.type:
            return cause.type
        cause = cause.__cause__ or getattr(cause, "cause", None)
    return None


async def test_a_compensation_started_by_hand_is_refused_and_records_no_operator(harness: Harness) -> None:
    key = await _completed_call(harness)
    handle = await _compensate_by_hand(harness, key, actor="operator:mallory")
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), 30)
    assert _failure_type(failed.value) == "CompensationNotRequested"

    record = await harness.ledger.get(key)
    assert record.status is Status.COMPLETED
    assert DOWNSTREAM.voids == {}
    assert await harness.ledger.find(f"{key}:compensation") is None  # nothing reserved, nothing sent
    assert all("mallory" not in e.actor for e in (await harness.ledger.get(key)).events)


async def test_the_operator_recorded_is_the_ledgers_request_and_a_request_serves_one_run(
    harness: Harness,
) -> None:
    key = await _completed_call(harness)
    # What the API writes before it starts the workflow; the workflow's input names someone else.
    await harness.ledger.request_compensation(key, actor="operator:alice", reason="duplicate order")
    first = await _compensate_by_hand(harness, key, actor="operator:mallory")
    done = await asyncio.wait_for(first.result(), 30)
    assert done.original_status is Status.COMPENSATED
    record = await harness.ledger.get(key)
    compensated = [e for e in record.events if e.kind == "compensated"]
    assert [(e.actor, e.reason, e.source) for e in compensated] == [
        ("operator:alice", "duplicate order", "compensation")
    ]
    assert DOWNSTREAM.voids == {f"{key}:compensation": 1}

    # The request was served: a second run started by hand finds nothing of its own to claim.
    second = await _compensate_by_hand(harness, key, actor="operator:mallory")
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(second.result(), 30)
    assert _failure_type(failed.value) == "CompensationNotRequested"
    events = (await harness.ledger.get(key)).events
    assert [e.kind for e in events].count("compensation_claimed") == 1
    assert all("mallory" not in e.actor for e in events)
    assert DOWNSTREAM.voids == {f"{key}:compensation": 1}
