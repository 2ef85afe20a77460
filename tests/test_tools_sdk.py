"""The tool SDK: what the model is shown, what it may send, and what reaches the tool."""

from __future__ import annotations

from typing import Any

import pytest

from onceflow import (
    InvalidToolArgumentsError,
    Tool,
    ToolContext,
    Toolset,
    destructive,
    external,
    read,
    write,
)
from onceflow.ledger import CallIdentity, Ledger, SideEffect

billing = Toolset("billing")
seen_contexts: list[ToolContext] = []


@billing.tool(external())
async def issue_credit(
    account_id: str, amount_cents: int, context: ToolContext, memo: str = ""
) -> dict[str, Any]:
    """Credit an account."""
    seen_contexts.append(context)
    return {"account_id": account_id, "amount_cents": amount_cents, "memo": memo}


@billing.tool(write(), name="tag_account", description="Tag an account for follow-up.")
async def tag(account_id: str, ctx: ToolContext) -> None:
    return None


def context(key: str = "run-1:call-1") -> ToolContext:
    run_id, tool_call_id = key.split(":")
    return ToolContext(idempotency_key=key, run_id=run_id, tool_call_id=tool_call_id, tenant="t1", attempt=1)


@pytest.mark.parametrize(("tool", "hidden"), [(issue_credit, "context"), (tag, "ctx")])
def test_json_schema_shows_the_arguments_but_not_the_context(tool: Tool, hidden: str) -> None:
    parameters = tool.json_schema()["parameters"]
    assert hidden not in parameters["properties"]
    assert "account_id" in parameters["properties"]
    assert hidden not in parameters.get("required", [])
    assert "ToolContext" not in str(tool.json_schema())


def test_json_schema_names_types_defaults_and_description() -> None:
    schema = issue_credit.json_schema()
    assert schema["name"] == "issue_credit"
    assert schema["description"] == "Credit an account."
    parameters = schema["parameters"]
    assert parameters["properties"]["account_id"]["type"] == "string"
    assert parameters["properties"]["amount_cents"]["type"] == "integer"
    assert parameters["properties"]["memo"]["default"] == ""
    assert sorted(parameters["required"]) == ["account_id", "amount_cents"]
    assert parameters["additionalProperties"] is False
    assert tag.json_schema()["name"] == "tag_account"
    assert tag.json_schema()["description"] == "Tag an account for follow-up."


def test_valid_arguments_come_back_in_json_form_with_defaults() -> None:
    assert issue_credit.validate_arguments({"account_id": "acct_1", "amount_cents": 500}) == {
        "account_id": "acct_1",
        "amount_cents": 500,
        "memo": "",
    }


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        (
            {"account_id": "acct_1", "amount_cents": "five hundred"},
            "amount_cents: Input should be a valid integer",
        ),
        ({"account_id": "acct_1", "amount_cents": [500]}, "amount_cents: Input should be a valid integer"),
        ({"amount_cents": 500}, "account_id: Field required"),
        ({"account_id": "acct_1", "amount_cents": 500, "currency": "EUR"}, "currency: Extra inputs"),
        (
            {"account_id": "acct_1", "amount_cents": 500, "context": {"idempotency_key": "mine"}},
            "context: Extra",
        ),
        (["acct_1", 500], "arguments must be a JSON object"),
    ],
)
def test_invalid_model_arguments_are_refused_with_a_clear_message(arguments: Any, problem: str) -> None:
    with pytest.raises(InvalidToolArgumentsError) as caught:
        issue_credit.validate_arguments(arguments)
    assert caught.value.tool == "issue_credit"
    assert str(caught.value).startswith("invalid arguments for tool 'issue_credit': ")
    assert any(p.startswith(problem) for p in caught.value.problems), caught.value.problems
    assert problem in str(caught.value)


async def test_invalid_arguments_are_refused_before_any_ledger_row_exists(ledger: Ledger) -> None:
    """The activity validates, then reserves: a bad call never reaches the ledger or the tool."""
    call = CallIdentity(tenant="t1", run_id="run-1", tool_call_id="call-1")

    async def validate_then_reserve(arguments: dict[str, Any]) -> None:
        valid = issue_credit.validate_arguments(arguments)
        await ledger.reserve(
            call,
            tool_name=issue_credit.name,
            side_effect=issue_credit.side_effect,
            arguments=valid,
            owner="w1",
        )

    with pytest.raises(InvalidToolArgumentsError):
        await validate_then_reserve({"account_id": "acct_1", "amount_cents": "lots"})

    assert await ledger.find(call.key) is None


async def test_invoke_passes_the_context_and_returns_json() -> None:
    seen_contexts.clear()
    ctx = context("run-9:call-2")

    result = await issue_credit.invoke({"account_id": "acct_1", "amount_cents": 500}, ctx)

    assert result == {"account_id": "acct_1", "amount_cents": 500, "memo": ""}
    assert seen_contexts == [ctx]
    assert seen_contexts[0].idempotency_key == "run-9:call-2"


def test_only_reads_are_retried() -> None:
    assert (read().side_effect, read().max_attempts) == (SideEffect.READ, 3)
    for effect in (write(), external(), destructive(), external(approval=True)):
        assert effect.max_attempts == 1
        assert effect.changes_the_world
    assert not read().changes_the_world
    assert external(approval=True).approval


def test_a_tool_must_be_async() -> None:
    tools = Toolset("sync")
    with pytest.raises(TypeError, match="async"):

        @tools.tool(read())  # type: ignore[arg-type]
        def lookup(account_id: str) -> None:
            return None


def test_tool_names_are_unique_in_a_toolset() -> None:
    tools = Toolset("dupes")

    @tools.tool(read())
    async def lookup(account_id: str) -> None:
        return None

    with pytest.raises(ValueError, match="already has a tool named 'lookup'"):

        @tools.tool(read(), name="lookup")
        async def other(account_id: str) -> None:
            return None

    assert [t.name for t in tools] == ["lookup"]
    assert tools.get("lookup").name == "lookup"
    with pytest.raises(LookupError, match="no tool 'missing'"):
        tools.get("missing")


def test_variadic_arguments_cannot_be_described_to_a_model() -> None:
    tools = Toolset("variadic")
    with pytest.raises(TypeError, match=r"\*args and \*\*kwargs"):

        @tools.tool(read())
        async def lookup(**filters: str) -> None:
            return None
