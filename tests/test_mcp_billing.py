"""MCP tools through the ledger, against the example billing MCP server (examples/billing_mcp) run as
real processes over stdio by the worker's own sessions, on a real Temporal dev server and PostgreSQL.

Two declarations of the same server: `billing` (issue_credit reconciled by find_credit, the lying
send_statement overridden to write) and `billing-manual` (no lookup, annotations trusted).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from onceflow.examples.billing.store import BillingStore
from onceflow.ledger import CallIdentity, FailureKind, Ledger, SideEffect, Status
from onceflow.mcp.runtime import McpToolsets, mcp_toolsets
from onceflow.mcp.tools import McpTool
from onceflow.runtime.agents import AgentRegistry, build_registry
from onceflow.sdk.payloads import ResolveSignal, ToolOutcome
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.history import activity_runs, history_events, reset_run, workflow_task_completed_after
from tests.support.mcp_servers import (
    CREDIT_SCRIPT,
    STATEMENT_SCRIPT,
    agent,
    applied,
    kill_server,
    received,
    stdio_server,
    wait_until,
)
from tests.workflow_harness import running_worker


@pytest.fixture(scope="module")
def server_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("billing-mcp")


@pytest.fixture(scope="module")
async def mcp_registry(server_dir: Path) -> AsyncIterator[tuple[AgentRegistry, McpToolsets]]:
    registry = build_registry(
        {
            "mcp_servers": {
                "billing": stdio_server(
                    server_dir,
                    "billing",
                    tools={
                        "issue_credit": {"timeout": "2s", "reconcile": "find_credit"},
                        "send_statement": {"effect": "write", "timeout": "1s"},
                    },
                ),
                "billing-approval": stdio_server(
                    server_dir,
                    "billing-approval",
                    allow=["lookup_order", "issue_credit"],
                    tools={"issue_credit": {"approval": True, "reconcile": "find_credit"}},
                ),
                # No lookup, but the server keeps keys for good: a day is an honest window.
                "billing-resend": stdio_server(
                    server_dir,
                    "billing-resend",
                    allow=["issue_credit"],
                    tools={"issue_credit": {"timeout": "2s", "dedup_window": "24h"}},
                ),
                "billing-manual": stdio_server(
                    server_dir,
                    "billing-manual",
                    allow=["lookup_order", "issue_credit", "send_statement"],
                    tools={"issue_credit": {"timeout": "30s"}, "send_statement": {"timeout": "1s"}},
                ),
            },
            "agents": {
                "credit": agent(CREDIT_SCRIPT, ["billing"]),
                "credit-manual": agent(CREDIT_SCRIPT, ["billing-manual"], on_indeterminate="fail"),
                "statement": agent(STATEMENT_SCRIPT, ["billing"], on_indeterminate="fail"),
                "statement-trusting": agent(STATEMENT_SCRIPT, ["billing-manual"], on_indeterminate="fail"),
                "careless": agent(CARELESS_SCRIPT, ["billing"]),
                "credit-approval": agent(CREDIT_SCRIPT, ["billing-approval"]),
                "big-credit": agent(BIG_CREDIT_SCRIPT, ["billing"]),
                "credit-resend": agent(HUNG_CREDIT_SCRIPT, ["billing-resend"]),
            },
        },
        "test_mcp_billing",
    )
    async with mcp_toolsets(registry) as servers:
        yield registry, servers


CARELESS_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "issue_credit", "arguments": {"account_id": "acct_x", "amount_cents": "lots"}}]},
    {"final": "{{ results.issue_credit }}"},
]


# Above the example's authorization limit (50000 cents): refused on policy grounds.
BIG_CREDIT_SCRIPT: list[dict[str, Any]] = [
    {
        "tool_calls": [
            {"name": "issue_credit", "arguments": {"account_id": "acct_big", "amount_cents": 90_000}}
        ]
    },
    {"final": "told: {{ results.issue_credit }}"},
]

# acct_hang's credits are applied and then hang for 30 s (tests/support/mcp_servers.FAULTS).
HUNG_CREDIT_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "issue_credit", "arguments": {"account_id": "acct_hang", "amount_cents": 700}}]},
    {"final": "credit: {{ results.issue_credit }}"},
]


def _order(order_id: str) -> str:
    return json.dumps({"order_id": order_id})


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
