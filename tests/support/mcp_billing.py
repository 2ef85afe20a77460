"""The example billing MCP server as the billing MCP tests declare it (tests/test_mcp_billing.py,
tests/test_mcp_billing_faults.py), run as real processes over stdio once per test module, and the
agents that call it.

Four declarations of the same server: `billing` (issue_credit reconciled by find_credit, the lying
send_statement overridden to write), `billing-manual` (no lookup, annotations trusted),
`billing-approval` (credits wait for an operator) and `billing-resend` (no lookup, a day's dedup window).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from onceflow.mcp.runtime import McpToolsets, mcp_toolsets
from onceflow.runtime.agents import AgentRegistry, build_registry
from tests.support.mcp_servers import CREDIT_SCRIPT, STATEMENT_SCRIPT, agent, stdio_server


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
