"""Every MCP request carries a key of its own, so a server deduplicating on the key alone cannot
answer a write with a read's cached answer.

The example billing MCP server runs here as a careless gateway would (`BILLING_MCP_CACHE_BY_KEY=1`):
it keeps the answer of every `tools/call`, whatever the tool, under `_meta`'s idempotency key and
answers any later request with that key from it. Before, the budget's `limit_from` read and the
reconcile lookup were sent with the write's own key: the gateway then answered the credit with the
allowance read's `{"limit": ...}`, and nothing was credited.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger, Status
from onceflow.mcp.runtime import McpToolsets, mcp_toolsets
from onceflow.runtime.agents import AgentRegistry, build_registry
from onceflow.sdk.keys import limit_read_key
from tests.support.mcp_servers import CREDIT_SCRIPT, FAULTS, agent, applied, received, stdio_server
from tests.workflow_harness import running_worker

BUDGET = {"entity": "account_id", "amount": "amount_cents", "limit_from": "credit_allowance"}


@pytest.fixture(scope="module")
def server_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("billing-mcp-keys")


@pytest.fixture(scope="module")
async def caching(server_dir: Path) -> AsyncIterator[tuple[AgentRegistry, McpToolsets]]:
    server = stdio_server(
        server_dir,
        "caching",
        allow=["lookup_order", "issue_credit", "credit_allowance"],
        tools={"issue_credit": {"timeout": "2s", "reconcile": "find_credit", "guards": BUDGET}},
    )
    server["env"] = {"BILLING_MCP_FAULTS": json.dumps(FAULTS), "BILLING_MCP_CACHE_BY_KEY": "1"}
    registry = build_registry(
        {"mcp_servers": {"caching": server}, "agents": {"credit": agent(CREDIT_SCRIPT, ["caching"])}},
        "test_mcp_keys",
    )
    async with mcp_toolsets(registry) as servers:
        yield registry, servers


async def test_a_write_behind_a_limit_read_is_applied_not_answered_with_the_reads_cached_answer(
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
    caching: tuple[AgentRegistry, McpToolsets],
    server_dir: Path,
) -> None:
    registry, _ = caching
    async with running_worker(temporal_env.client, ledger, registry) as harness:
        handle = await harness.start("credit", json.dumps({"order_id": "ord_keys1"}))
        await asyncio.wait_for(handle.result(), 60)
    key = f"{handle.id}:call_1_0"
    record = await ledger.get(key)
    assert record.status is Status.COMPLETED
    # A real credit, under the write's key, and not the allowance read's {"limit": ...}.
    assert "limit" not in record.result, record.result
    assert record.result["idempotency_key"] == key
    assert applied(server_dir, "caching", key)
    assert received(server_dir, "caching", key, "issue_credit") == 1
    # The limit read went out once, under a key of its own.
    assert received(server_dir, "caching", key, "credit_allowance") == 0
    assert received(server_dir, "caching", limit_read_key(key), "credit_allowance") == 1


async def test_a_reconcile_lookup_carries_its_own_key_and_the_writes_beside_it(
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
    caching: tuple[AgentRegistry, McpToolsets],
    server_dir: Path,
) -> None:
    """acct_hang's credit is applied, then the server hangs: the lookup settles it, under a key of
    its own (the gateway would otherwise hand the hung write's key whatever it kept for it)."""
    registry, _ = caching
    async with running_worker(temporal_env.client, ledger, registry) as harness:
        handle = await harness.start("credit", json.dumps({"order_id": "ord_hang"}))
        await asyncio.wait_for(handle.result(), 90)
    key = f"{handle.id}:call_1_0"
    record = await ledger.get(key)
    assert record.status is Status.COMPLETED
    assert record.settled_by == "reconciler"
    assert record.result["idempotency_key"] == key
    assert received(server_dir, "caching", key, "find_credit") == 0
    lookups = [k for k in _keys_received(server_dir / "caching.db", "find_credit") if k.startswith(key)]
    assert lookups and all(k.startswith(f"{key}:lookup:") for k in lookups), lookups
    assert len(set(lookups)) == len(lookups)  # a new key for every lookup


def _keys_received(db: Path, tool: str) -> list[str]:
    conn = sqlite3.connect(db, timeout=10)
    try:
        return [
            row[0] for row in conn.execute("SELECT idempotency_key FROM mcp_requests WHERE tool = ?", (tool,))
        ]
    finally:
        conn.close()
