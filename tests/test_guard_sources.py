"""A Python toolset's `Guards(limit_from=...)` must name a read tool of the same agent that can be
called with the entity argument alone; agents.yaml is refused, naming agent and tool, otherwise."""

from __future__ import annotations

from typing import Any

import pytest

from onceflow import Guards, ToolContext, Toolset, external, read
from onceflow.runtime.agents import AgentConfigError, build_registry

BUDGET = Guards(entity="order_id", amount="amount_cents", limit_from="refundable_balance")


def _refund_toolset(name: str, guards: Guards = BUDGET) -> Toolset:
    toolset = Toolset(name)

    @toolset.tool(external(), guards=guards)
    async def issue_refund(order_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
        return {"order_id": order_id, "amount_cents": amount_cents}

    return toolset


refunds = _refund_toolset("refunds")

balances = Toolset("balances")


@balances.tool(read())
async def refundable_balance(order_id: str) -> dict[str, int]:
    return {"limit": 5000}


wrong_balances = Toolset("wrong_balances")


@wrong_balances.tool(external())
async def refundable_balance_written(order_id: str, context: ToolContext) -> int:  # pragma: no cover
    return 0


needy_balances = Toolset("needy_balances")


@needy_balances.tool(read(), name="refundable_balance")
async def needy_refundable_balance(order_id: str, currency: str) -> int:  # pragma: no cover
    return 0


other_entity_balances = Toolset("other_entity_balances")


@other_entity_balances.tool(read(), name="refundable_balance")
async def account_balance(account_id: str) -> int:  # pragma: no cover
    return 0


written_source = _refund_toolset(
    "written_source",
    Guards(entity="order_id", amount="amount_cents", limit_from="refundable_balance_written"),
)


def _registry(*toolsets: str) -> Any:
    return build_registry(
        {
            "toolsets": {name: f"tests.test_guard_sources:{name}" for name in toolsets},
            "agents": {
                "refunder": {
                    "model": {"provider": "scripted", "script": [{"final": "done"}]},
                    "toolsets": list(toolsets),
                }
            },
        },
        "agents.yaml",
    )


def test_a_limit_from_naming_a_read_tool_of_the_agent_is_accepted() -> None:
    registry = _registry("refunds", "balances")
    assert registry.tool("refunder", "issue_refund").guards.limit_from == "refundable_balance"


@pytest.mark.parametrize(
    ("toolsets", "problem"),
    [
        (
            ("refunds",),
            "guards.limit_from names 'refundable_balance', which is not a tool of this agent "
            "(it has: issue_refund)",
        ),
        (
            ("written_source", "wrong_balances"),
            "guards.limit_from names 'refundable_balance_written', which is declared external; "
            "a limit comes from a read tool",
        ),
        (
            ("refunds", "needy_balances"),
            "guards.limit_from names 'refundable_balance', which also requires currency; "
            "it is called with 'order_id' alone",
        ),
        (
            ("refunds", "other_entity_balances"),
            "guards.limit_from names 'refundable_balance', which takes no 'order_id' argument",
        ),
    ],
)
def test_a_limit_from_that_cannot_give_the_limit_is_refused_naming_agent_and_tool(
    toolsets: tuple[str, ...], problem: str
) -> None:
    with pytest.raises(AgentConfigError) as refused:
        _registry(*toolsets)
    assert refused.value.agent == "refunder"
    assert str(refused.value).startswith("agents.yaml, agent 'refunder': tool ")
    assert ".issue_refund: " + problem in str(refused.value)
