"""bench/peers.py's Pydantic AI way: an agent under Temporal durability calls one tool."""

from __future__ import annotations

import json
from typing import Any

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    from peers_common import from_prompt, post_credit
    from pydantic_ai import Agent, RunContext, Tool
    from pydantic_ai.durable_exec.temporal import TemporalDurability
    from pydantic_ai.messages import ModelMessage, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.messages import ModelResponse as PaiResponse
    from pydantic_ai.models.function import AgentInfo, FunctionModel


async def issue_credit_pai(ctx: RunContext[None], account_id: str, amount_cents: int) -> dict[str, Any]:
    """Credit an account, in cents."""
    return await post_credit(account_id, amount_cents, f"{activity.info().workflow_id}:{ctx.tool_call_id}")


def credit_model_pai(messages: list[ModelMessage], info: AgentInfo) -> PaiResponse:
    """One tool call, then the answer."""
    returns = [part for m in messages for part in getattr(m, "parts", []) if isinstance(part, ToolReturnPart)]
    if not returns:
        text = str(messages[0].parts[-1].content)  # type: ignore[union-attr]
        return PaiResponse(
            parts=[ToolCallPart("issue_credit", from_prompt(text), tool_call_id="call_credit")]
        )
    return PaiResponse(parts=[TextPart(f"credited: {json.dumps(returns[-1].content, sort_keys=True)}")])


PAI_AGENT: Agent[None, str] = Agent(
    FunctionModel(credit_model_pai),
    name="peers_pydantic_ai",
    tools=[Tool(issue_credit_pai, takes_ctx=True, name="issue_credit")],
    capabilities=[TemporalDurability()],
)


@workflow.defn(name="PeersPydanticAICredit")
class PydanticAICreditWorkflow:
    @workflow.run
    async def run(self, text: str) -> str:
        return (await PAI_AGENT.run(text)).output
