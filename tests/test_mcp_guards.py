"""`guards:` of MCP tools in agents.yaml: carried onto the tools agents call, shown by `onceflow mcp
inspect`, and refused at start-up, naming server, tool and problem, when they do not fit the tool.
Real server processes (examples/billing_mcp)."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from onceflow.cli.commands import app
from onceflow.ledger import Guard, SideEffect
from onceflow.mcp.guards import tool_guard_problems
from onceflow.mcp.runtime import McpStartupError, mcp_toolsets
from onceflow.runtime.agents import AgentConfigError, build_registry
from onceflow.sdk.tools import Guards
from tests.support.mcp_servers import CREDIT_SCRIPT, agent, stdio_server

CREDIT_GUARDS = {
    "intent": "reuse",
    "entity": "account_id",
    "on_busy": "refuse",
    "amount": "amount_cents",
    "limit": 10000,
    "replaceable": True,
}


def _server(directory: Path, tools: dict[str, Any]) -> dict[str, Any]:
    """The example server, its credit reconciled by find_credit (so that lookup is not offered)."""
    credit = {"reconcile": "find_credit", **tools.get("issue_credit", {})}
    return stdio_server(directory, "billing", tools={**tools, "issue_credit": credit})


def _agents(server: dict[str, Any]) -> dict[str, Any]:
    return {
        "mcp_servers": {"billing-mcp": server},
        "agents": {"clerk": agent(CREDIT_SCRIPT, ["billing-mcp"])},
    }


async def test_declared_guards_reach_the_tool_the_agent_calls(tmp_path: Path) -> None:
    server = _server(tmp_path, {"issue_credit": {"guards": CREDIT_GUARDS}})
    registry = build_registry(_agents(server))
    async with mcp_toolsets(registry):
        credit = registry.tool("clerk", "issue_credit")
        lookup = registry.tool("clerk", "lookup_order")
        assert credit.guards == Guards(
            intent="reuse",
            entity="account_id",
            on_busy="refuse",
            amount="amount_cents",
            limit=Decimal(10000),
            replaceable=True,
        )
        assert lookup.guards == Guards()
        parameters = credit.json_schema()["parameters"]
        assert parameters["properties"]["replaces"]["type"] == "string"
        assert "replaces" not in parameters.get("required", [])
        arguments, replaces = credit.split_replaces(
            {"account_id": "acct_7", "amount_cents": 500, "replaces": "call_1_0"}
        )
        assert (arguments, replaces) == ({"account_id": "acct_7", "amount_cents": 500}, "call_1_0")
        assert credit.ledger_guard(arguments) == Guard(
            intent="reuse",
            entity="acct_7",
            exclusive=True,
            on_busy="refuse",
            amount=Decimal(500),
            limit=Decimal(10000),
            toolset="billing-mcp",  # its slots and budgets are this server's, not another's
        )


@pytest.mark.parametrize(
    ("tools", "problem"),
    [
        (
            {"issue_credit": {"guards": {"entity": "acct"}}},
            "tools.issue_credit.guards: guards.entity names 'acct', which is not one of its arguments",
        ),
        (
            {"issue_credit": {"guards": {"entity": "memo"}}},
            "tools.issue_credit.guards.entity names 'memo', which the input schema does not require",
        ),
        (
            {"lookup_order": {"guards": {"entity": "order_id"}}},
            "tools.lookup_order.guards: guards are for tools that change the world, and 'lookup_order' "
            "is classified read",
        ),
    ],
)
async def test_start_up_refuses_guards_that_do_not_fit_the_tool(
    tmp_path: Path, tools: dict[str, Any], problem: str
) -> None:
    registry = build_registry(_agents(_server(tmp_path, tools)))
    with pytest.raises(McpStartupError) as refused:
        async with mcp_toolsets(registry):
            pass
    assert str(refused.value).startswith("MCP server 'billing-mcp': ")
    assert problem in str(refused.value)


@pytest.mark.parametrize(
    ("source", "tools", "problem"),
    [
        ("lookup_order", {}, "guards.limit_from names 'lookup_order', which takes no 'account_id' argument"),
        (
            "send_statement",
            {"send_statement": {"effect": "write"}},
            "guards.limit_from names 'send_statement', which is declared write; a limit comes from a read",
        ),
        ("refundable", {}, "guards.limit_from names 'refundable', which is not a tool of this agent"),
    ],
)
async def test_start_up_refuses_a_limit_from_that_cannot_give_the_limit(
    tmp_path: Path, source: str, tools: dict[str, Any], problem: str
) -> None:
    guards = {"entity": "account_id", "amount": "amount_cents", "limit_from": source}
    declared = {**tools, "issue_credit": {"guards": guards}}
    registry = build_registry(_agents(_server(tmp_path, declared)))
    with pytest.raises(AgentConfigError) as refused:
        async with mcp_toolsets(registry):
            pass
    assert refused.value.agent == "clerk"
    assert f"tool billing-mcp.issue_credit: {problem}" in str(refused.value)


@pytest.mark.parametrize(
    ("guards", "problem"),
    [
        ({"amount": "amount_cents", "limit": 5}, "a budget (guards.amount) is kept per entity"),
        (
            {"entity": "account_id", "amount": "amount_cents"},
            "exactly one of guards.limit and guards.limit_from",
        ),
        ({"entity": "account_id", "amount": "amount_cents", "limit": -1}, "guards.limit cannot be negative"),
        ({"entity": "account_id", "amount": "amount_cents", "limit": "lots"}, "must be a number"),
        ({"entity": "account_id", "limit": 5}, "guards.limit and guards.limit_from need guards.amount"),
        ({"intent": "maybe"}, "intent: Input should be 'hold', 'reuse' or 'allow'"),
        ({"entity": "account_id", "per": "day"}, "guards.per: Extra inputs are not permitted"),
    ],
)
def test_guards_that_make_no_sense_are_refused_when_agents_yaml_is_read(
    tmp_path: Path, guards: dict[str, Any], problem: str
) -> None:
    server = _server(tmp_path, {"issue_credit": {"guards": guards}})
    with pytest.raises(AgentConfigError) as refused:
        build_registry(_agents(server))
    assert "mcp_servers.billing-mcp.tools.issue_credit.guards" in str(refused.value)
    assert problem in str(refused.value)


def test_guarded_arguments_must_be_of_a_type_that_can_name_an_entity_or_count() -> None:
    schema = {
        "type": "object",
        "properties": {"order": {"type": "object"}, "amount": {"type": "boolean"}},
        "required": ["order", "amount"],
    }
    guards = Guards(entity="order", amount="amount", limit=10)
    assert tool_guard_problems("refund", guards, schema, SideEffect.EXTERNAL) == [
        "tools.refund.guards.entity names 'order', of type object; it must be one of integer, number, string",
        "tools.refund.guards.amount names 'amount', of type boolean; it must be one of integer, number, string",
    ]
    fine = {**schema, "properties": {"order": {"type": "string"}, "amount": {"anyOf": [{"type": "integer"}]}}}
    assert tool_guard_problems("refund", guards, fine, SideEffect.EXTERNAL) == []


def test_inspect_shows_each_tools_guards(tmp_path: Path) -> None:
    server = _server(tmp_path, {"issue_credit": {"guards": CREDIT_GUARDS}})
    path = tmp_path / "agents.yaml"
    path.write_text(yaml.safe_dump(_agents(server)))
    runner = CliRunner()
    shown = runner.invoke(app, ["mcp", "inspect", "billing-mcp", "--agents", str(path), "--json"])
    assert shown.exit_code == 0, shown.output
    tools = {tool["name"]: tool for tool in json.loads(shown.stdout)["tools"]}
    assert tools["issue_credit"]["guards"] == {
        "intent": "reuse",
        "entity": "account_id",
        "on_busy": "refuse",
        "amount": "amount_cents",
        "limit": "10000",
        "replaceable": True,
    }
    assert tools["lookup_order"]["guards"] is None
    text = runner.invoke(app, ["mcp", "inspect", "billing-mcp", "--agents", str(path)])
    assert text.exit_code == 0
    assert (
        "guards: intent=reuse, entity=account_id, on_busy=refuse, amount=amount_cents, limit=10000, "
        "replaceable=True" in text.stdout
    )
