"""MCP tools through the ledger when an answer is lost, against the example billing MCP server
(examples/billing_mcp) run as real processes over stdio, on a real Temporal dev server and PostgreSQL:
a credit applied and then hung, the server killed mid-call and after applying, a tool that claims to
be read-only, a Temporal reset to before the write, and a resend inside the receiver's dedup window.
Each key reaches the server once (twice for the resend, with one credit). The paths with a final
answer are in tests/test_mcp_billing.py.

The servers are declared in tests/support/mcp_billing.py.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from onceflow.examples.billing_mcp.store import BillingStore
from onceflow.ledger import Ledger, Status
from onceflow.mcp.runtime import McpToolsets
from onceflow.runtime.agents import AgentRegistry
from onceflow.sdk.payloads import ToolOutcome
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.history import activity_runs, history_events, reset_run, workflow_task_completed_after
from tests.support.mcp_billing import _order, mcp_registry, server_dir
from tests.support.mcp_servers import applied, kill_server, received, wait_until
from tests.workflow_harness import running_worker

__all__ = ["mcp_registry", "server_dir"]  # the fixtures, used by name


async def test_apply_then_hang_is_indeterminate_then_settled_by_the_lookup_tool_with_one_effect(
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
    mcp_registry: tuple[AgentRegistry, McpToolsets],
    server_dir: Path,
) -> None:
    registry, _ = mcp_registry
    async with running_worker(temporal_env.client, ledger, registry) as harness:
        handle = await harness.start("credit", _order("ord_hang"))
        result = await asyncio.wait_for(handle.result(), 90)
    key = f"{handle.id}:call_1_0"
    record = await ledger.get(key)
    assert record.status is Status.COMPLETED
    transitions = [(e.from_status, e.to_status) for e in record.events if e.to_status is not None]
    assert (Status.STARTED, Status.INDETERMINATE) in transitions
    assert record.settled_by == "reconciler"
    assert record.result["idempotency_key"] == key
    assert record.result_reference == record.result["credit_id"]
    # One request received for the key (not merely one effect after deduplication).
    assert received(server_dir, "billing", key, "issue_credit") == 1
    assert "acct_hang" in result.final


async def test_server_killed_mid_call_leaves_the_call_unknown_never_resent_and_the_session_is_remade(
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
    mcp_registry: tuple[AgentRegistry, McpToolsets],
    server_dir: Path,
) -> None:
    registry, servers = mcp_registry
    connection = servers.connections["billing-manual"]
    async with running_worker(temporal_env.client, ledger, registry) as harness:
        opened = connection.sessions_opened
        handle = await harness.start("credit-manual", _order("ord_slow"))
        key = f"{handle.id}:call_1_0"
        await wait_until(
            lambda: received(server_dir, "billing-manual", key) == 1, what="the credit to arrive"
        )
        kill_server(server_dir, "billing-manual")
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), 60)
        record = await ledger.get(key)
        assert record.status is Status.INDETERMINATE
        assert any("Connection closed" in (event.reason or "") for event in record.events)

        # The worker's next call to that server starts a fresh session and works.
        second = await harness.start("credit-manual", _order("ord_after_kill"))
        await asyncio.wait_for(second.result(), 60)
        assert (await ledger.get(f"{second.id}:call_1_0")).status is Status.COMPLETED
        assert connection.sessions_opened == opened + 1
    await asyncio.sleep(1)
    assert received(server_dir, "billing-manual", key) == 1  # never re-sent
    assert (await ledger.get(key)).status is Status.INDETERMINATE


async def test_a_tool_claiming_read_only_but_overridden_to_write_gets_one_attempt(
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
    mcp_registry: tuple[AgentRegistry, McpToolsets],
    server_dir: Path,
) -> None:
    registry, _ = mcp_registry
    statement = json.dumps({"account_id": "acct_liar"})
    async with running_worker(temporal_env.client, ledger, registry) as harness:
        overridden = await harness.start("statement", statement)
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(overridden.result(), 60)
        # Trusted as read-only, a timeout is retried, and after the last attempt the model is told.
        trusted = await harness.start("statement-trusting", statement)
        told = await asyncio.wait_for(trusted.result(), 60)
    key = f"{overridden.id}:call_0_0"
    assert (await ledger.get(key)).status is Status.INDETERMINATE
    assert received(server_dir, "billing", key, "send_statement") == 1
    # The same tool trusted as read-only was sent three times, and reads have no ledger row.
    trusted_key = f"{trusted.id}:call_0_0"
    assert "failed after 3 attempts" in told.final
    assert received(server_dir, "billing-manual", trusted_key, "send_statement") == 3
    assert await ledger.find(trusted_key) is None


async def test_server_killed_after_applying_is_settled_by_the_lookup_through_a_new_session(
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
    mcp_registry: tuple[AgentRegistry, McpToolsets],
    server_dir: Path,
) -> None:
    registry, servers = mcp_registry
    connection = servers.connections["billing"]
    async with running_worker(temporal_env.client, ledger, registry) as harness:
        opened = connection.sessions_opened
        handle = await harness.start("credit", _order("ord_hang"))
        key = f"{handle.id}:call_1_0"
        # Killed once the credit is committed, not merely received: the server logs a request before
        # it applies it, and a kill in between leaves nothing for the lookup to find, ever.
        await wait_until(lambda: applied(server_dir, "billing", key), what="the credit to be applied")
        kill_server(server_dir, "billing")
        # The lookup's own deadline (2 s) is shorter than the server takes to start again; the start
        # carries on in the background and a later round finds the session ready.
        await asyncio.wait_for(handle.result(), 180)
    record = await ledger.get(key)
    assert record.status is Status.COMPLETED
    assert any(e.to_status is Status.INDETERMINATE for e in record.events)
    assert record.settled_by == "reconciler"
    assert record.result["idempotency_key"] == key
    assert connection.sessions_opened > opened
    assert received(server_dir, "billing", key, "issue_credit") == 1


async def test_a_reset_to_before_the_write_gets_the_recorded_result_without_calling_the_server(
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
    mcp_registry: tuple[AgentRegistry, McpToolsets],
    server_dir: Path,
) -> None:
    registry, _ = mcp_registry
    client = temporal_env.client
    async with running_worker(client, ledger, registry) as harness:
        handle = await harness.start("credit", _order("ord_replay"))
        first = await asyncio.wait_for(handle.result(), 60)
        key = f"{handle.id}:call_1_0"
        assert handle.result_run_id is not None
        events = await history_events(client, handle.id, handle.result_run_id)
        first_model = next(r for r in activity_runs(events) if r.activity_type == "call_model")
        assert first_model.closed is not None
        reset_point = workflow_task_completed_after(events, first_model.closed.event_id)
        new_run_id = await reset_run(
            client, handle.id, handle.result_run_id, reset_point, "test: replay before the MCP write"
        )
        again = client.get_workflow_handle_for(AgentRunWorkflow.run, handle.id, run_id=new_run_id)
        second = await asyncio.wait_for(again.result(), 60)
    assert second.final == first.final
    write = next(
        r
        for r in activity_runs(await history_events(client, handle.id, new_run_id))
        if r.activity_type == "run_write_tool"
    )
    assert write.closed is not None
    payload = write.closed.activity_task_completed_event_attributes.result.payloads[0]
    outcome = client.data_converter.payload_converter.from_payload(payload, ToolOutcome)
    assert outcome.key == key
    assert outcome.replayed
    assert received(server_dir, "billing", key, "issue_credit") == 1


async def test_unknown_mcp_call_is_settled_by_a_resend_inside_its_dedup_window(
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
    mcp_registry: tuple[AgentRegistry, McpToolsets],
    server_dir: Path,
) -> None:
    registry, _ = mcp_registry
    tool = registry.agent("credit-resend").tools["issue_credit"]
    assert tool.effect.dedup_window == timedelta(hours=24)
    assert tool.reconcile is None
    async with running_worker(temporal_env.client, ledger, registry) as harness:
        handle = await harness.start("credit-resend", "{}")
        result = await asyncio.wait_for(handle.result(), 60)
    key = f"{handle.id}:call_0_0"
    record = await ledger.get(key)
    assert record.status is Status.COMPLETED
    assert record.evidence["strategy"] == "resend_within_dedup_window"
    assert [e.kind for e in record.events] == ["reserved", "indeterminate", "resend", "settled"]
    assert record.result["idempotency_key"] == key
    # The server heard the key twice and applied one credit: the resend got the first answer.
    assert received(server_dir, "billing-resend", key, "issue_credit") == 2
    store = BillingStore(str(server_dir / "billing-resend.db"))
    try:
        assert store.effect(key) == (1, False)
    finally:
        store.close()
    assert record.result["credit_id"] in result.final
