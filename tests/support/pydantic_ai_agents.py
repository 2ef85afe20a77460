"""A Pydantic AI agent on Temporal with onceflow's writes, driven by Pydantic AI's own FunctionModel.

The model follows a script carried in the prompt (JSON: a list of turns, each a list of tool calls,
then a final answer), so a worker in another process, or a model request asked again after a reset,
answers the same. `fresh_ids: true` gives every call a new id per model request, as a real provider
does. Built at import, outside any workflow, as Pydantic AI's Temporal integration requires.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.durable_exec.temporal import AgentPlugin, PydanticAIPlugin, TemporalDurability
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from onceflow.adapters.heard import OnceflowState
from onceflow.adapters.pydantic_ai import OnceflowWrites, WriteTools
from tests.support.downstream import DOWNSTREAM, toolset

WRITE_TOOLS = ("issue_credit", "issue_credit_unreconciled", "issue_credit_reusing", "issue_credit_approved")
WRITES = WriteTools(
    [tool for tool in toolset.tools if tool.name in WRITE_TOOLS],
    agent="pydantic-ai-billing",
    tool_policy={"on_indeterminate": "pause", "recheck_interval": "2s", "reconcile_initial_interval": "1s"},
)


class AdapterRunInput(BaseModel):
    tenant: str
    script: list[list[dict[str, Any]]]  # an empty turn is a final answer (the run may go on later)
    fresh_ids: bool = False


class ContinuingRunInput(BaseModel):
    """A run that answers, then continues as new and goes on with the same conversation, `executions`
    times (tests/support/*_workflow.py, the `...ContinuingWorkflow`s). `pass_state`: hand
    OnceflowState on to the next execution, as docs/adapters.md says to."""

    tenant: str
    script: list[list[dict[str, Any]]]
    executions: int = 2
    pass_state: bool = True
    history: Any = None  # the conversation so far, in the framework's own serialised form
    onceflow: OnceflowState | None = None


def _script(messages: list[ModelMessage]) -> dict[str, Any]:
    for message in messages:
        for part in getattr(message, "parts", []):
            if getattr(part, "part_kind", None) == "user-prompt":
                return json.loads(str(part.content))
    raise AssertionError("no prompt")


def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    plan = _script(messages)
    turn = sum(isinstance(message, ModelResponse) for message in messages)
    if turn >= len(plan["script"]) or not plan["script"][turn]:
        results = [
            part.content
            for message in messages
            for part in getattr(message, "parts", [])
            if getattr(part, "part_kind", None) == "tool-return"
        ]
        return ModelResponse(parts=[TextPart(json.dumps({"done": True, "results": results}, default=str))])
    calls = []
    for position, call in enumerate(plan["script"][turn]):
        call_id = (
            f"call_{uuid.uuid4().hex[:8]}" if plan.get("fresh_ids") else call.get("id", f"c{turn}_{position}")
        )
        calls.append(ToolCallPart(call["tool"], call["args"], tool_call_id=call_id))
    return ModelResponse(parts=calls)


async def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order (a read: Pydantic AI's activity, under its retry policy)."""
    DOWNSTREAM.read_attempts += 1
    if DOWNSTREAM.read_failures_left > 0:
        DOWNSTREAM.read_failures_left -= 1
        raise ConnectionError("transient: connection reset")
    return {"order_id": order_id, "account_id": f"acct_{order_id}", "amount_cents": 1250}


# The same credits with no tool_policy of their own: they take the serving OnceflowPlugin's, and
# that default is `on_indeterminate: fail` (tests/test_adapter_runs.py).
DEFAULT_POLICY_WRITES = WriteTools(
    [tool for tool in toolset.tools if tool.name == "issue_credit_unreconciled"],
    agent="pydantic-ai-billing-default-policy",
)
DEFAULT_POLICY_AGENT: Agent[None, str] = Agent(
    FunctionModel(scripted),
    name="pydantic_billing_default_policy",
    capabilities=[TemporalDurability(), OnceflowWrites(DEFAULT_POLICY_WRITES)],
)

AGENT: Agent[None, str] = Agent(
    FunctionModel(scripted),
    name="pydantic_billing",
    tools=[lookup_order],
    capabilities=[TemporalDurability(), OnceflowWrites(WRITES)],
)


def agent_plugins() -> list[PydanticAIPlugin | AgentPlugin]:
    """Pydantic AI's plugins for a worker serving AGENT and DEFAULT_POLICY_AGENT."""
    return [PydanticAIPlugin(), AgentPlugin(AGENT), AgentPlugin(DEFAULT_POLICY_AGENT)]
