"""The runtime never undoes anything by itself. A completed call stays completed when its run fails,
is cancelled, times out or is reset: compensation happens only when an operator asks (the API)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger, Status
from onceflow.runtime.agents import Agent, AgentConfig, AgentRegistry
from onceflow.runtime.client import start_run
from onceflow.sdk.payloads import AgentRunInput, Phase
from onceflow.workflows.compensation import compensation_workflow_id
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
