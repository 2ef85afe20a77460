"""MCP tools through the ledger, against the example billing MCP server (examples/billing_mcp) run as
real processes over stdio by the worker's own sessions, on a real Temporal dev server and PostgreSQL:
the tools classified, a write sent once with its key, and the answers that are final (a rejection,
a policy refusal, a schema refused before anything is sent) or wait for an approval. Lost answers,
killed servers, resets and resends are in tests/test_mcp_billing_faults.py.

The servers are declared in tests/support/mcp_billing.py: `billing` (issue_credit reconciled by
find_credit, the lying send_statement overridden to write) and `billing-manual` (no lookup,
annotations trusted), among others.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import CallIdentity, FailureKind, Ledger, SideEffect, Status
from onceflow.mcp.runtime import McpToolsets
from onceflow.mcp.tools import McpTool
from onceflow.runtime.agents import AgentRegistry
from onceflow.sdk.payloads import ResolveSignal
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.mcp_billing import _order, mcp_registry, server_dir
from tests.support.mcp_servers import received
from tests.workflow_harness import running_worker

__all__ = ["mcp_registry", "server_dir"]  # the fixtures, used by name


async def test_worker_lists_the_servers_tools_and_classifies_them_by_annotations_and_overrides(
    mcp_registry: tuple[AgentRegistry, McpToolsets],
) -> None:
    registry, _ = mcp_registry
    tools = registry.agent("credit").tools
    # find_credit is the reconcile lookup: the reconciler calls it, the model is not offered it.
    assert sorted(tools) == ["credit_allowance", "issue_credit", "lookup_order", "send_statement"]
    assert all(isinstance(tool, McpTool) for tool in tools.values())
    assert tools["lookup_order"].side_effect is SideEffect.READ
    assert tools["lookup_order"].effect.max_attempts == 3
    assert tools["issue_credit"].side_effect is SideEffect.EXTERNAL  # not destructive, open world
    assert tools["issue_credit"].effect.max_attempts == 1
    assert tools["issue_credit"].reconcile is not None
    assert tools["send_statement"].side_effect is SideEffect.WRITE  # says read-only; agents.yaml disagrees
    trusting = registry.agent("statement-trusting").tools["send_statement"]
    assert trusting.side_effect is SideEffect.READ
    # The model sees the server's own JSON Schema.
    spec = registry.agent("credit").spec().tools["issue_credit"]
    assert spec.json_schema["parameters"]["required"] == ["account_id", "amount_cents"]
    assert spec.has_reconcile


async def test_write_is_sent_once_with_its_ledger_key_in_meta(
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
    mcp_registry: tuple[AgentRegistry, McpToolsets],
    server_dir: Path,
) -> None:
    registry, servers = mcp_registry
    connection = servers.connections["billing"]
    opened = connection.sessions_opened
    async with running_worker(temporal_env.client, ledger, registry) as harness:
        handle = await harness.start("credit", _order("ord_mcp1"))
        result = await asyncio.wait_for(handle.result(), 60)
        again = await harness.start("credit", _order("ord_mcp2"))
        await asyncio.wait_for(again.result(), 60)
    # Every call of both runs went through the worker's one session with the server.
    assert connection.sessions_opened == opened
    key = f"{handle.id}:call_1_0"
    record = await ledger.get(key)
    assert record.status is Status.COMPLETED
    assert record.attempt == 1
    # The server read the key from _meta: the credit it applied is filed under the ledger's key.
    assert record.result["idempotency_key"] == key
    assert record.result["account_id"] == "acct_mcp1"
    assert received(server_dir, "billing", key, "issue_credit") == 1
    assert result.calls[-1].key == key


async def test_an_error_result_from_a_write_is_a_definite_rejection(
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
    mcp_registry: tuple[AgentRegistry, McpToolsets],
    server_dir: Path,
) -> None:
    registry, _ = mcp_registry
    async with running_worker(temporal_env.client, ledger, registry) as harness:
        handle = await harness.start("credit", _order("ord_closed"))
        result = await asyncio.wait_for(handle.result(), 60)
    key = f"{handle.id}:call_1_0"
    record = await ledger.get(key)
    assert record.status is Status.FAILED
    assert record.failure_kind is FailureKind.REJECTED
    assert "account closed" in (record.error or "")
    assert received(server_dir, "billing", key) == 1
    assert "account closed" in result.final


async def test_arguments_that_break_the_servers_schema_are_refused_before_anything_is_reserved_or_sent(
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
    mcp_registry: tuple[AgentRegistry, McpToolsets],
    server_dir: Path,
) -> None:
    registry, _ = mcp_registry
    async with running_worker(temporal_env.client, ledger, registry) as harness:
        handle = await harness.start("careless", "{}")
        result = await asyncio.wait_for(handle.result(), 60)
    key = f"{handle.id}:call_0_0"
    assert "amount_cents: 'lots' is not of type 'integer'" in result.final
    assert await ledger.find(key) is None
    assert received(server_dir, "billing", key) == 0


async def test_an_mcp_write_that_needs_approval_is_sent_only_once_approved(
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
    mcp_registry: tuple[AgentRegistry, McpToolsets],
    server_dir: Path,
) -> None:
    registry, _ = mcp_registry
    async with running_worker(temporal_env.client, ledger, registry) as harness:
        handle = await harness.start("credit-approval", _order("ord_approve"))
        key = f"{handle.id}:call_1_0"

        async def awaiting() -> bool:
            record = await ledger.find(key)
            return record is not None and record.status is Status.AWAITING_APPROVAL

        deadline = asyncio.get_running_loop().time() + 30
        while not await awaiting():
            assert asyncio.get_running_loop().time() < deadline, "the call never waited for approval"
            await asyncio.sleep(0.1)
        assert received(server_dir, "billing-approval", key) == 0
        await ledger.approve(key, actor="operator:test", reason="checked the order", tenant="acme")
        await handle.signal(AgentRunWorkflow.resolve, ResolveSignal(key=key, actor="operator:test"))
        await asyncio.wait_for(handle.result(), 60)
    record = await ledger.get(key)
    assert record.status is Status.COMPLETED
    assert record.approved_by == "operator:test"
    assert received(server_dir, "billing-approval", key, "issue_credit") == 1


async def test_a_refusal_marked_in_meta_is_policy_refused_final_and_sent_once(
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
    mcp_registry: tuple[AgentRegistry, McpToolsets],
    server_dir: Path,
) -> None:
    registry, _ = mcp_registry
    async with running_worker(temporal_env.client, ledger, registry) as harness:
        handle = await harness.start("big-credit", "{}")
        result = await asyncio.wait_for(handle.result(), 60)
    key = f"{handle.id}:call_0_0"
    record = await ledger.get(key)
    assert (record.status, record.failure_kind) == (Status.FAILED, FailureKind.POLICY_REFUSED)
    assert "authorization limit" in (record.error or "")
    told = json.loads(result.final.removeprefix("told: "))
    assert (told["final"], told["reason"]) == (True, "policy_refused")
    assert received(server_dir, "billing", key, "issue_credit") == 1
    # Not re-reserved under its key, by any worker: the ledger says so for good.
    again = await ledger.reserve(
        CallIdentity(tenant="acme", run_id=handle.id, tool_call_id="call_0_0"),
        tool_name="issue_credit",
        side_effect=SideEffect.EXTERNAL,
        arguments={"account_id": "acct_big", "amount_cents": 90_000},
        owner="another-worker",
    )
    assert not again.may_send
