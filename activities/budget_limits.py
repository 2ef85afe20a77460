"""A budget's limit read from its `limit_from` read tool, just before the write is reserved."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from decimal import Decimal
from typing import Any

from onceflow.activities.tool_io import tool_context
from onceflow.ledger import ToolExecutionRecord
from onceflow.ledger.guarded import decided_again
from onceflow.runtime.agents import AgentRegistry
from onceflow.sdk.keys import call_key, limit_read_key
from onceflow.sdk.payloads import ToolCallInput
from onceflow.sdk.tools import Guards, Tool, as_amount


class BudgetLimitUnavailableError(Exception):
    """The read tool that gives a budget's limit failed or answered something else: nothing sent.
    For a new call the model is told; a recorded one is asked about again (ERR_BUDGET_LIMIT_UNAVAILABLE)."""

    def __init__(self, tool: str, reader: str, problem: str) -> None:
        super().__init__(
            f"{tool} was not sent: its budget limit comes from {reader}, which failed ({problem[:300]}); "
            "try again later"
        )


def limit_arguments(declared: Guards, arguments: dict[str, Any]) -> dict[str, Any]:
    """What a `limit_from` read tool is asked with: the entity, and the currency when declared."""
    assert declared.entity is not None
    asked = {declared.entity: arguments[declared.entity]}
    if declared.currency is not None:
        asked[declared.currency] = arguments.get(declared.currency)
    return asked


async def budget_limit(
    registry: AgentRegistry,
    tool_input: ToolCallInput,
    tool: Tool,
    arguments: dict[str, Any],
    recorded: ToolExecutionRecord | None,
) -> Decimal | None:
    """The entity's limit, read from the tool's `limit_from` read tool, when it declares one.

    A recorded call that the guards will not decide again (approved, in flight, settled) keeps
    the limit it was reserved under: nothing is read for it.
    """
    declared = tool.guards
    if declared.limit_from is None or declared.entity is None:
        return None
    if recorded is not None and recorded.budget_limit is not None and not decided_again(recorded):
        return recorded.budget_limit
    reader = registry.tool(tool_input.agent, declared.limit_from)
    write_key = call_key(tool_input.run_id, tool_input.call.id)
    # The read's own key, the write's beside it: a cache keyed on the key alone must not answer
    # the write with this read's answer (onceflow/mcp/meta.py).
    context = replace(
        tool_context(tool_input, 1), idempotency_key=limit_read_key(write_key), for_key=write_key
    )
    try:
        value = await asyncio.wait_for(
            reader.invoke(limit_arguments(declared, arguments), context),
            reader.effect.timeout.total_seconds(),
        )
    except Exception as exc:  # any failure: nothing is reserved, and the model is told
        raise BudgetLimitUnavailableError(tool.name, reader.name, f"{type(exc).__name__}: {exc}") from exc
    limit = as_amount(value.get("limit") if isinstance(value, dict) else value)
    if limit is None:
        raise BudgetLimitUnavailableError(tool.name, reader.name, f"returned {value!r}, not a limit")
    return limit
