"""Declaring guards on a tool: what the ledger is handed for one call, and what is refused as bad input."""

from __future__ import annotations

from decimal import Decimal

import pytest

from onceflow import Guards, InvalidToolArgumentsError, ToolContext, Toolset, external, read
from onceflow.ledger import Heard
from onceflow.sdk.testing import tool_contract_problems

tools = Toolset("guarded")


@tools.tool(external(), guards=Guards(intent="reuse", entity="order_id", amount="amount_cents", limit=5000))
async def refund(order_id: str, amount_cents: int, context: ToolContext) -> dict[str, str]:
    return {}


@tools.tool(read())
async def refundable(order_id: str) -> int:
    return 7


@tools.tool(
    external(),
    guards=Guards(entity="order_id", on_busy="allow", amount="amount_cents", limit_from="refundable"),
)
async def capped(order_id: str, amount_cents: int, context: ToolContext) -> dict[str, str]:
    return {}


@tools.tool(external(), guards=Guards(entity="order_id", on_busy="allow", replaceable=True))
async def note(order_id: str, text: str, context: ToolContext) -> dict[str, str]:
    return {}


def test_a_call_hands_the_ledger_its_entity_amount_and_static_limit() -> None:
    guard = refund.ledger_guard({"order_id": "ord_1", "amount_cents": 1250})
    assert (guard.intent, guard.entity, guard.exclusive, guard.on_busy) == ("reuse", "ord_1", True, "hold")
    assert (guard.amount, guard.limit) == (Decimal(1250), Decimal(5000))
    assert guard.replaces is None


def test_a_limit_from_a_read_tool_is_the_one_read_for_this_call() -> None:
    guard = capped.ledger_guard({"order_id": "ord_1", "amount_cents": 1}, limit=Decimal(7))
    assert (guard.amount, guard.limit) == (Decimal(1), Decimal(7))


@pytest.mark.parametrize("amount", [-1, "NaN", "lots"])
def test_an_amount_that_is_no_amount_is_bad_input(amount: object) -> None:
    with pytest.raises(InvalidToolArgumentsError, match="amount_cents"):
        refund.ledger_guard({"order_id": "ord_1", "amount_cents": amount})


@pytest.mark.parametrize("order", [None, ""])
def test_a_missing_entity_is_bad_input(order: object) -> None:
    with pytest.raises(InvalidToolArgumentsError, match="order_id"):
        refund.ledger_guard({"order_id": order, "amount_cents": 1})


def test_on_busy_allow_records_the_entity_without_making_it_exclusive() -> None:
    guard = note.ledger_guard({"order_id": "ord_1", "text": "hi"}, replaces_key="run:call_0_0")
    assert (guard.entity, guard.exclusive, guard.replaces) == ("ord_1", False, "run:call_0_0")


def test_a_replaceable_tool_offers_replaces_and_takes_it_out_of_the_arguments() -> None:
    schema = note.json_schema()["parameters"]
    assert "replaces" in schema["properties"] and "replaces" not in schema.get("required", [])
    rest, replaces = note.split_replaces({"order_id": "o", "text": "t", "replaces": "call_0_0"})
    assert (rest, replaces) == ({"order_id": "o", "text": "t"}, "call_0_0")
    assert note.split_replaces({"order_id": "o", "text": "t"}) == ({"order_id": "o", "text": "t"}, None)
    with pytest.raises(InvalidToolArgumentsError, match="replaces"):
        note.split_replaces({"order_id": "o", "text": "t", "replaces": 7})
    # A tool that is not replaceable keeps `replaces` as an argument, which its schema then refuses.
    assert refund.split_replaces({"replaces": "x"}) == ({"replaces": "x"}, None)


def test_guard_declarations_that_cannot_work_are_contract_problems() -> None:
    broken = Toolset("broken")

    @broken.tool(external(), guards=Guards(entity="order", amount="cents", limit_from=None))
    async def pay(order_id: str, amount_cents: int, context: ToolContext) -> None: ...

    @broken.tool(read(), guards=Guards(intent="reuse"))
    async def look(order_id: str) -> None: ...

    problems = " | ".join(tool_contract_problems(pay))
    assert "guards.entity names 'order'" in problems
    assert "guards.amount names 'cents'" in problems
    assert "exactly one of guards.limit and guards.limit_from" in problems
    assert "guards are for tools that change the world" in " ".join(tool_contract_problems(look))


@tools.tool(external(), guards=Guards(entity="order_id", amount="amount", currency="currency", limit=100))
async def refund_fx(order_id: str, amount: int, currency: str, context: ToolContext) -> dict[str, str]:
    return {}


def test_a_call_hands_the_ledger_its_toolset_currency_and_what_the_model_had_heard() -> None:
    guard = refund_fx.ledger_guard({"order_id": "ord_1", "amount": 5, "currency": "eur"}, heard=["call_0_0"])
    assert (guard.toolset, guard.currency) == ("guarded", "EUR")
    assert guard.heard == frozenset({Heard(tool_call_id="call_0_0")})  # a bare id: judged as it stands
    # `reuse` makes every twin the same intent: what the model heard does not matter to it.
    assert refund.ledger_guard({"order_id": "o", "amount_cents": 1}, heard=["x"]).heard == frozenset()


@pytest.mark.parametrize("currency", [None, "", 12, "euro dollars"])
def test_a_currency_that_is_no_code_is_bad_input(currency: object) -> None:
    with pytest.raises(InvalidToolArgumentsError, match="currency"):
        refund_fx.ledger_guard({"order_id": "ord_1", "amount": 5, "currency": currency})


def test_a_currency_needs_an_amount_and_an_argument() -> None:
    problems = " | ".join(Guards(currency="ccy").problems({"ccy"}))
    assert "guards.currency is the currency of a budget's amount" in problems
    assert "guards.currency names 'cur'" in " | ".join(
        Guards(entity="o", amount="a", limit=1, currency="cur").problems({"o", "a"})
    )


def test_a_limit_source_is_called_with_the_currency_too() -> None:
    from onceflow.sdk.guard_sources import limit_source_problem

    fx = Toolset("fx")

    @fx.tool(read())
    async def limit_by_order(order_id: str) -> int:
        return 1

    @fx.tool(read())
    async def limit_by_order_and_currency(order_id: str, currency: str) -> int:
        return 1

    @fx.tool(
        external(),
        guards=Guards(entity="order_id", amount="amount", currency="currency", limit_from="x"),
    )
    async def pay(order_id: str, amount: int, currency: str, context: ToolContext) -> None: ...

    assert "takes no 'currency' argument" in (limit_source_problem(pay, limit_by_order) or "")
    assert limit_source_problem(pay, limit_by_order_and_currency) is None
