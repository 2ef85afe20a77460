"""A tool's answer with NaN or Infinity in it: the call is settled honestly, and nothing is lost.

JSON has no NaN or Infinity and PostgreSQL's jsonb refuses them. Before, such a result was quietly
turned into `null` on its way to the ledger and the model. Now:
- a read's answer is not handed on: the model is told the tool's result could not be kept;
- a write that answered with one did take effect: it is recorded completed, its result replaced by
  `{"result_omitted": ...}` saying why, exactly as an oversized result is;
- a reconcile hook that finds the effect with such a result settles the call completed the same way.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

from temporalio.testing import WorkflowEnvironment

from onceflow import ReconcileOutcome, ToolContext, Toolset, external, read
from onceflow.ledger import Ledger, Status
from onceflow.runtime.agents import Agent, AgentConfig, AgentRegistry
from onceflow.sdk.keys import call_key
from tests.workflow_harness import running_worker

tools = Toolset("non-finite")
APPLIED: Counter[str] = Counter()


@tools.tool(read())
async def measure(order_id: str) -> dict[str, Any]:
    """A read whose answer JSON cannot carry."""
    return {"order_id": order_id, "ratio": math.nan}


@tools.tool(external(timeout=timedelta(seconds=2)))
async def charge(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Takes effect, then answers with Infinity."""
    APPLIED[context.idempotency_key] += 1
    return {"charged": amount_cents, "rate": math.inf}


async def found_with_nan(account_id: str, amount_cents: int, context: ToolContext) -> ReconcileOutcome:
    found = APPLIED[context.idempotency_key] > 0
    if not found:
        return ReconcileOutcome.failed(looked_up=context.idempotency_key)
    return ReconcileOutcome.completed({"charged": amount_cents, "rate": -math.inf}, looked_up="yes")


@tools.tool(external(timeout=timedelta(seconds=1)), reconcile=found_with_nan)
async def charge_slowly(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Takes effect, then never answers: the reconcile hook finds it."""
    APPLIED[context.idempotency_key] += 1
    await asyncio.sleep(3600)
    return {}


def agent() -> Agent:
    arguments = {"account_id": "acct_nan", "amount_cents": 700}
    script = [
        {
            "tool_calls": [
                {"name": "measure", "arguments": {"order_id": "o1"}},
                {"name": "charge", "arguments": arguments},
                {"name": "charge_slowly", "arguments": arguments},
            ]
        },
        {"final": "done"},
    ]
    config = AgentConfig.model_validate(
        {
            "model": {"provider": "scripted", "script": script},
            "instructions": "You charge.",
            "toolsets": ["non-finite"],
            "tool_policy": {
                "on_indeterminate": "pause",
                "reconcile_deadline": "20s",
                "reconcile_initial_interval": "0.2s",
                "reconcile_max_interval": "1s",
            },
        }
    )
    return Agent("nan-agent", config, {t.name: t for t in tools})


async def test_non_finite_results_are_settled_honestly_and_never_lose_a_completion(
    temporal_env: WorkflowEnvironment, ledger: Ledger
) -> None:
    APPLIED.clear()
    registry = AgentRegistry({"nan-agent": agent()})
    async with running_worker(temporal_env.client, ledger, registry) as harness:
        handle = await harness.start("nan-agent", '{"order_id": "o1"}', run_id=f"run-{uuid.uuid4().hex[:10]}")
        result = await asyncio.wait_for(handle.result(), 60)

    assert result.final == "done"
    by_tool = {c.tool: c for c in result.calls}
    assert by_tool["measure"].status == "error"
    assert "cannot be kept" in (by_tool["measure"].detail or ""), by_tool["measure"]
    for tool in ("charge", "charge_slowly"):
        record = await ledger.get(call_key(handle.id, by_tool[tool].tool_call_id), with_events=False)
        assert record.status is Status.COMPLETED, (tool, record.status)
        assert APPLIED[record.key] == 1
        assert set(record.result) == {"result_omitted"}, record.result
        assert "not a JSON number" in record.result["result_omitted"]


def test_an_mcp_result_or_lookup_answer_with_nan_is_seen_not_turned_into_null() -> None:
    """What the MCP SDK parses from a server's JSON (`NaN` is accepted by its parser) reaches the
    same checks as a Python tool's result: the write path and the reconciler above."""
    from mcp.types import CallToolResult, TextContent

    from onceflow.mcp.tools import lookup_outcome, result_value
    from onceflow.sdk.payloads import result_problem
    from onceflow.sdk.tools import OutcomeStatus, to_jsonable

    answer = CallToolResult.model_validate_json(
        '{"content": [{"type": "text", "text": "x"}], "structuredContent": {"credit": {"rate": NaN}}}'
    )
    assert result_problem(to_jsonable(result_value(answer))) == (
        "$.credit.rate: nan is not a JSON number (only finite numbers are)"
    )
    lookup = CallToolResult(
        content=[TextContent(type="text", text="found")],
        structured_content={"status": "completed", "result": {"rate": math.inf}},
    )
    found = lookup_outcome(lookup, "mcp billing.find_credit")
    assert found.status is OutcomeStatus.COMPLETED
    assert result_problem(found.value) is not None  # the reconciler records result_omitted


def test_anthropic_tool_input_with_nan_is_refused_as_invalid_arguments_not_kept_as_null() -> None:
    """The Anthropic SDK's JSON parser lets NaN through into `tool_use.input`; the data converter
    would then have turned it into null on the way to the tool."""
    from types import SimpleNamespace

    from onceflow.models.anthropic import AnthropicMessagesModel

    block = SimpleNamespace(type="tool_use", id="toolu_1", name="charge", input={"amount_cents": math.nan})
    fine = SimpleNamespace(type="tool_use", id="toolu_2", name="charge", input={"amount_cents": 10**30})
    answer = SimpleNamespace(content=[block, fine], usage=None)
    turn = AnthropicMessagesModel._turn(None, answer)  # type: ignore[arg-type]  # reads nothing of self
    refused, kept = turn.tool_calls
    assert refused.arguments == {} and refused.invalid_arguments == '{"amount_cents": NaN}'
    # A huge integer is kept here: the write path refuses it, naming it (see test_model_providers).
    assert kept.arguments == {"amount_cents": 10**30} and kept.invalid_arguments is None
