"""The example billing MCP server over streamable HTTP (a real uvicorn process on a free loopback port,
guarded by a bearer token that agents.yaml takes from the environment), driven by agent runs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from onceflow.examples.billing_mcp import requests_received
from onceflow.ledger import FailureKind, Ledger, Status
from onceflow.mcp.runtime import McpStartupError, mcp_toolsets
from onceflow.runtime.agents import AgentRegistry, build_registry
from tests.support.mcp_servers import CREDIT_SCRIPT, HttpBillingServer, agent
from tests.workflow_harness import running_worker

TOKEN = "mcp-test-token"
DIRECT_CREDIT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "issue_credit", "arguments": {"account_id": "acct_down", "amount_cents": 500}}]},
    {"final": "credit: {{ results.issue_credit }}"},
]


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[HttpBillingServer]:
    server = HttpBillingServer(tmp_path, TOKEN)
    yield server
    server.stop()


def _registry(url: str) -> AgentRegistry:
    return build_registry(
        {
            "mcp_servers": {
                "billing-http": {
                    "url": url,
                    "headers": {"Authorization": "Bearer ${ONCEFLOW_TEST_MCP_TOKEN}"},
                    "connect_timeout": "5s",
                    "tools": {"issue_credit": {"timeout": "5s", "reconcile": "find_credit"}},
                }
            },
            "agents": {
                "credit": agent(CREDIT_SCRIPT, ["billing-http"]),
                "direct-credit": agent(DIRECT_CREDIT, ["billing-http"]),
            },
        }
    )


async def test_http_server_with_a_header_from_the_environment_takes_a_write_once(
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
    http_server: HttpBillingServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ONCEFLOW_TEST_MCP_TOKEN", TOKEN)
    await http_server.start()
    registry = _registry(http_server.url)
    async with (
        mcp_toolsets(registry) as servers,
        running_worker(temporal_env.client, ledger, registry) as harness,
    ):
        handle = await harness.start("credit", json.dumps({"order_id": "ord_web"}))
        await asyncio.wait_for(handle.result(), 60)
        key = f"{handle.id}:call_1_0"
        record = await ledger.get(key)
        assert record.status is Status.COMPLETED
        assert record.result["idempotency_key"] == key
        assert requests_received(str(http_server.db), key) == 1

        # The server goes away: the write's session check fails before anything is sent.
        http_server.stop()
        down = await harness.start("direct-credit", "{}")
        told = await asyncio.wait_for(down.result(), 60)
        down_key = f"{down.id}:call_0_0"
        refused = await ledger.get(down_key)
        assert refused.status is Status.FAILED
        assert refused.failure_kind is FailureKind.NOT_ATTEMPTED
        assert "cannot start or reach it" in (refused.error or "")
        assert '"took_effect": false' in told.final

        # Back on the same port: the next call opens a new session and goes through.
        await http_server.start()
        again = await harness.start("direct-credit", "{}")
        await asyncio.wait_for(again.result(), 60)
        assert (await ledger.get(f"{again.id}:call_0_0")).status is Status.COMPLETED
        assert servers.connections["billing-http"].sessions_opened == 2
    assert requests_received(str(http_server.db), down_key) == 0


async def test_a_wrong_bearer_token_stops_start_up_with_the_servers_answer(
    http_server: HttpBillingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONCEFLOW_TEST_MCP_TOKEN", "not-the-token")
    await http_server.start()
    with pytest.raises(McpStartupError) as refused:
        async with mcp_toolsets(_registry(http_server.url)):
            pass
    assert "MCP server 'billing-http': cannot start or reach it" in str(refused.value)
    assert "HTTP 401 from POST " + http_server.url in str(refused.value)
