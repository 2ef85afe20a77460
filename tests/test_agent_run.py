"""Agent runs on a real Temporal dev server and a real PostgreSQL ledger."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import CallIdentity, Ledger, SideEffect, Status
from onceflow.runtime.constants import AGENT, PHASE, TENANT
from onceflow.sdk.payloads import AgentRunInput, AgentRunResult, Phase, ResolveSignal
from onceflow.workflows.agent_run import PATCH_CURRENT, AgentRunWorkflow
from tests.support.agents import support_registry
from tests.support.downstream import DOWNSTREAM
from tests.workflow_harness import Harness, running_worker

ORDER = json.dumps({"order_id": "o1"})


@pytest.fixture
async def harness(temporal_env: WorkflowEnvironment, ledger: Ledger) -> AsyncIterator[Harness]:
    DOWNSTREAM.reset()
    async with running_worker(temporal_env.client, ledger, support_registry()) as h:
        yield h


async def wait_for_phase(handle: WorkflowHandle[Any, Any], phase: Phase, timeout: float = 20) -> None:
    async def poll() -> None:
        while (await handle.query(AgentRunWorkflow.status)).phase != phase:
            await asyncio.sleep(0.1)

    await asyncio.wait_for(poll(), timeout)


async def test_write_completes_once_and_the_model_sees_the_result(harness: Harness) -> None:
    handle = await harness.start("credit-reconciled", ORDER)
    result = await handle.result()
    key = f"{handle.id}:call_1_0"
    assert DOWNSTREAM.received == DOWNSTREAM.effects == {key: 1}
    record = await harness.ledger.get(key)
    assert record.status is Status.COMPLETED
    assert record.result == {"credit_id": "cr_1", "account_id": "acct_o1", "amount_cents": 1250}
    assert "cr_1" in result.final
    assert [c.status for c in result.calls] == ["ok", "completed"]


async def test_write_timeout_after_apply_is_reconciled_and_run_gets_real_result(harness: Harness) -> None:
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    handle = await harness.start("credit-reconciled", ORDER)
    result = await asyncio.wait_for(handle.result(), 30)
    key = f"{handle.id}:call_1_0"
    assert DOWNSTREAM.received == DOWNSTREAM.effects == {key: 1}
    assert DOWNSTREAM.send_attempts == 1
    record = await harness.ledger.get(key)
    assert record.status is Status.COMPLETED
    assert record.settled_by == "reconciler"
    assert [e.to_status for e in record.events if e.to_status] == [
        Status.STARTED,
        Status.INDETERMINATE,
        Status.COMPLETED,
    ]
    assert "cr_1" in result.final


async def test_indeterminate_with_pause_waits_for_a_resolve_signal(harness: Harness) -> None:
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    handle = await harness.start("credit-pause", ORDER)
    await wait_for_phase(handle, Phase.AWAITING_RECONCILIATION)
    key = f"{handle.id}:call_1_0"
    status = await handle.query(AgentRunWorkflow.status)
    assert [p.key for p in status.pending] == [key]
    assert (await harness.ledger.get(key)).status is Status.INDETERMINATE
    await handle.signal(
        AgentRunWorkflow.resolve,
        ResolveSignal(
            key=key,
            status="completed",
            reason="saw cr_1 in the billing console",
            actor="alice",
            result={"credit_id": "cr_1"},
        ),
    )
    result = await asyncio.wait_for(handle.result(), 20)
    record = await harness.ledger.get(key)
    assert record.status is Status.COMPLETED
    assert record.settled_by == "signal:alice"  # a name in a signal is not an authenticated operator
    assert record.reason == "saw cr_1 in the billing console"
    assert "cr_1" in result.final
    assert DOWNSTREAM.received == DOWNSTREAM.effects == {key: 1}


async def test_indeterminate_with_fail_fails_the_run_naming_the_key(harness: Harness) -> None:
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    handle = await harness.start("credit-fail", ORDER)
    key = f"{handle.id}:call_1_0"
    with pytest.raises(WorkflowFailureError) as failure:
        await asyncio.wait_for(handle.result(), 30)
    assert key in str(failure.value.cause)
    assert (await harness.ledger.get(key)).status is Status.INDETERMINATE
    assert DOWNSTREAM.received == DOWNSTREAM.effects == {key: 1}


async def test_two_resolves_at_once_one_wins_and_the_run_resumes_once(harness: Harness) -> None:
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    handle = await harness.start("credit-pause", ORDER)
    await wait_for_phase(handle, Phase.AWAITING_RECONCILIATION)
    key = f"{handle.id}:call_1_0"
    await asyncio.gather(
        handle.signal(
            AgentRunWorkflow.resolve,
            ResolveSignal(key=key, status="completed", reason="operator saw it", actor="alice"),
        ),
        handle.signal(
            AgentRunWorkflow.resolve,
            ResolveSignal(key=key, status="failed", reason="reconciler found none", actor="reconciler"),
        ),
    )
    result = await asyncio.wait_for(handle.result(), 20)
    record = await harness.ledger.get(key)
    settles = [e for e in record.events if e.kind == "settled"]
    assert len(settles) == 1
    assert record.settled_by == settles[0].actor
    # The model heard exactly one answer for the call, and it is the ledger's.
    assert result.turns == 3
    assert result.calls[-1].status == record.status.value


async def test_read_retried_write_not_retried(harness: Harness) -> None:
    DOWNSTREAM.read_failures_left = 2
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    handle = await harness.start("credit-fail", ORDER)
    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), 30)
    assert DOWNSTREAM.read_attempts == 3
    assert DOWNSTREAM.send_attempts == 1


async def test_refused_before_sending_is_failed_and_the_model_is_told(harness: Harness) -> None:
    DOWNSTREAM.modes["acct_o1"] = "locked"
    handle = await harness.start("credit-fail", ORDER)
    result = await handle.result()
    key = f"{handle.id}:call_1_0"
    record = await harness.ledger.get(key)
    assert record.status is Status.FAILED
    assert record.failure_kind == "not_attempted"
    assert DOWNSTREAM.effects == {}
    assert DOWNSTREAM.received == {key: 1}  # received once, refused at the door
    assert "locked" in result.final


async def test_a_key_recorded_for_another_tenant_fails_the_run_and_sends_nothing(harness: Harness) -> None:
    run_id = f"run-clash-{uuid.uuid4().hex[:8]}"
    key = f"{run_id}:call_1_0"
    await harness.ledger.reserve(
        CallIdentity(tenant="other", run_id=run_id, tool_call_id="call_1_0"),
        tool_name="issue_credit",
        side_effect=SideEffect.EXTERNAL,
        arguments={"account_id": "acct_o1", "amount_cents": 1250},
        owner="someone-else",
    )
    handle = await harness.start("credit-reconciled", ORDER, tenant="acme", run_id=run_id)
    with pytest.raises(WorkflowFailureError) as failure:
        await asyncio.wait_for(handle.result(), 30)
    assert "another tenant" in str(failure.value.cause)
    assert DOWNSTREAM.send_attempts == 0
    record = await harness.ledger.get(key, with_events=False)
    assert (record.tenant, record.owner, record.status) == ("other", "someone-else", Status.STARTED)


# -- what a run records at its start ----------------------------------------------------------------
# `start_run` sets OnceflowPhase, OnceflowTenant and OnceflowAgent at the start, so the run shows them
# before its first task and need not upsert them; a run started another way (a bare Temporal client)
# still upserts them itself. Either way it takes every earlier patch under one marker
# (workflows/agent_run.py, PATCH_CURRENT); runs recorded before replay them one by one
# (tests/test_replay.py).


async def _start_events(
    handle: WorkflowHandle[AgentRunWorkflow, AgentRunResult],
) -> tuple[list[str], list[list[str]]]:
    """The run's patch markers' ids and its search-attribute upserts' names, in order."""
    history = await handle.fetch_history()
    markers: list[str] = []
    upserts: list[list[str]] = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            details = event.marker_recorded_event_attributes.details["patch-data"].payloads[0].data
            markers.append(json.loads(details)["id"])
        elif event.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
            upserts.append(sorted(fields))
    return markers, upserts


async def test_a_run_from_start_run_shows_its_attributes_at_once_and_records_one_marker(
    harness: Harness,
) -> None:
    handle = await harness.start("credit-reconciled", ORDER, tenant="acme")
    started = (await handle.describe()).typed_search_attributes
    assert (started.get(PHASE), started.get(TENANT), started.get(AGENT)) == (
        "running",
        "acme",
        "credit-reconciled",
    )
    await handle.result()
    markers, upserts = await _start_events(handle)
    assert markers == [PATCH_CURRENT]
    # The patch's own TemporalChangeVersion, then the phase at the end: nothing at the start.
    assert upserts == [["TemporalChangeVersion"], [PHASE.name]]
    assert (await handle.describe()).typed_search_attributes.get(PHASE) == "completed"


async def test_a_run_started_without_them_upserts_them_itself(harness: Harness) -> None:
    handle = await harness.client.start_workflow(
        AgentRunWorkflow.run,
        AgentRunInput(agent="credit-reconciled", tenant="acme", input=ORDER, max_turns=20),
        id=f"run-{uuid.uuid4().hex[:10]}",
        task_queue=harness.task_queue,
    )
    await handle.result()
    markers, upserts = await _start_events(handle)
    assert markers == [PATCH_CURRENT]
    assert upserts[1] == sorted([AGENT.name, PHASE.name, TENANT.name])
    described = (await handle.describe()).typed_search_attributes
    assert (described.get(TENANT), described.get(AGENT)) == ("acme", "credit-reconciled")
