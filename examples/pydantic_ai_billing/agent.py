"""The agent: Pydantic AI's, with its own read tool, and one onceflow write tool added by a capability.

Only two things differ from a plain Temporal-hosted Pydantic AI agent: the credit tool is declared
with onceflow's decorator (`external()`, a reconcile hook, the key in its ToolContext), and the agent
gets `OnceflowWrites(WRITES)` beside `TemporalDurability()`.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.durable_exec.temporal import TemporalDurability
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from onceflow import ReconcileOutcome, ToolContext, Toolset, external
from onceflow.adapters.pydantic_ai import OnceflowWrites, WriteTools
from onceflow.examples.local_stack import Payments

PAYMENTS = Payments()  # this example's far side
billing_writes = Toolset("pydantic-ai-billing")


async def find_credit(account_id: str, amount_cents: int, context: ToolContext) -> ReconcileOutcome:
    """Reconcile hook: did a credit land under this call's key?"""
    found = PAYMENTS.credits.get(context.idempotency_key)
    if found is None:
        return ReconcileOutcome.failed(looked_up=context.idempotency_key)
    return ReconcileOutcome.completed(found, result_reference=found["credit_id"])


@billing_writes.tool(external(timeout=timedelta(seconds=2)), reconcile=find_credit)
async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Credit an account, in cents."""
    return await PAYMENTS.credit(account_id, amount_cents, context.idempotency_key)


WRITES = WriteTools(
    billing_writes,
    agent="pydantic-ai-billing",
    tool_policy={"on_indeterminate": "pause", "reconcile_initial_interval": "0.5s", "recheck_interval": "5s"},
)


async def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order: its account and amount. A read: Pydantic AI's activity and retries."""
    return {"order_id": order_id, "account_id": f"acct_{order_id}", "amount_cents": 1250}


def billing_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A stand-in model: look the order up, credit it, then say what happened."""
    returns = [part for m in messages for part in getattr(m, "parts", []) if isinstance(part, ToolReturnPart)]
    if not returns:
        order_id = str(messages[0].parts[-1].content).split()[-1]  # type: ignore[union-attr]
        return ModelResponse(
            parts=[ToolCallPart("lookup_order", {"order_id": order_id}, tool_call_id="call_lookup")]
        )
    last = returns[-1]
    if last.tool_name == "lookup_order":
        order: Any = last.content  # the dict lookup_order returned
        arguments = {"account_id": order["account_id"], "amount_cents": order["amount_cents"]}
        return ModelResponse(parts=[ToolCallPart("issue_credit", arguments, tool_call_id="call_credit")])
    return ModelResponse(parts=[TextPart(f"credit: {json.dumps(last.content, sort_keys=True)}")])


AGENT: Agent[None, str] = Agent(
    FunctionModel(billing_model),
    name="pydantic_ai_billing",
    tools=[lookup_order],
    capabilities=[TemporalDurability(), OnceflowWrites(WRITES)],
)
