"""bench/peers.py's OpenAI Agents way: an agent under Temporal's plugin calls one `activity_as_tool`."""

from __future__ import annotations

import ast
import json
from typing import Any

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    from agents import Agent as AgentsAgent
    from agents import Model, ModelResponse, Runner, Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
    from peers_common import AGENTS_TOOL, WRITE_TIMEOUT, from_prompt, post_credit
    from temporalio.openai_agents.workflow import activity_as_tool


@activity.defn(name=AGENTS_TOOL)
async def agents_credit(account_id: str, amount_cents: int) -> dict[str, Any]:
    """Credit an account, in cents."""
    info = activity.info()
    return await post_credit(account_id, amount_cents, f"{info.workflow_id}:{info.activity_id}")


class CreditModel(Model):
    """One tool call, then the answer."""

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        items = [i if isinstance(i, dict) else i.model_dump() for i in items]
        outputs = [i for i in items if i.get("type") == "function_call_output"]
        if not outputs:
            text = next(i["content"] for i in items if i.get("role") == "user")
            call = ResponseFunctionToolCall(
                arguments=json.dumps(from_prompt(str(text))),
                call_id="call_credit",
                name=agents_credit.__name__,  # activity_as_tool names the tool after the function
                type="function_call",
                id="fc_call_credit",
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        credit = ast.literal_eval(outputs[-1]["output"])  # activity_as_tool hands back str() of the result
        answer = ResponseOutputText(
            text=f"credited: {credit['credit_id']}", annotations=[], type="output_text"
        )
        message = ResponseOutputMessage(
            id="msg", content=[answer], role="assistant", status="completed", type="message"
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model does not stream")


@workflow.defn(name="PeersOpenAIAgentsCredit")
class OpenAIAgentsCreditWorkflow:
    @workflow.run
    async def run(self, text: str) -> str:
        agent: AgentsAgent[None] = AgentsAgent(
            name="credit",
            instructions="Credit accounts.",
            tools=[activity_as_tool(agents_credit, start_to_close_timeout=WRITE_TIMEOUT)],
        )
        return str((await Runner.run(agent, input=text)).final_output)
