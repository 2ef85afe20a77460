"""An OpenAI Agents SDK agent on Temporal with onceflow's writes, driven by a scripted Model (the SDK's
Model interface; no API key). The script rides in the prompt (JSON, as in
tests/support/pydantic_ai_agents.py), so every worker and every retried model call answers the same.
"""

from __future__ import annotations

import ast
import json
import uuid
from datetime import timedelta
from typing import Any

from agents import Model, ModelResponse, Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
from temporalio import activity
from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
from temporalio.openai_agents.testing import TestModelProvider

from onceflow.adapters.openai_agents import WriteTools
from tests.support.downstream import DOWNSTREAM, toolset

OPENAI_WRITES = WriteTools(
    [
        tool
        for tool in toolset.tools
        if tool.name
        in ("issue_credit", "issue_credit_unreconciled", "issue_credit_reusing", "issue_credit_approved")
    ],
    agent="openai-agents-billing",
    tool_policy={"on_indeterminate": "pause", "recheck_interval": "2s", "reconcile_initial_interval": "1s"},
)


# The same credit with no tool_policy of its own (see pydantic_ai_agents.DEFAULT_POLICY_WRITES).
OPENAI_DEFAULT_POLICY_WRITES = WriteTools(
    [tool for tool in toolset.tools if tool.name == "issue_credit_unreconciled"],
    agent="openai-agents-billing-default-policy",
)


@activity.defn(name="openai_lookup_order")
async def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order (a read: an activity via activity_as_tool, under its retry policy)."""
    DOWNSTREAM.read_attempts += 1
    if DOWNSTREAM.read_failures_left > 0:
        DOWNSTREAM.read_failures_left -= 1
        raise ConnectionError("transient: connection reset")
    return {"order_id": order_id, "account_id": f"acct_{order_id}", "amount_cents": 1250}


def _parsed(output: str) -> Any:
    """A tool output: onceflow's is JSON; activity_as_tool's is `str()` of what the activity returned."""
    for parse in (json.loads, ast.literal_eval):
        try:
            return parse(output)
        except (ValueError, SyntaxError):
            continue
    return output


def _items(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return [item if isinstance(item, dict) else item.model_dump() for item in value]


def _responses(items: list[dict[str, Any]]) -> int:
    """How many model answers the conversation holds: each run of function calls is one, and so is
    each assistant message."""
    answers, previous = 0, None
    for item in items:
        kind = item.get("type")
        if (kind == "function_call" and previous != "function_call") or item.get("role") == "assistant":
            answers += 1
        previous = kind
    return answers


class ScriptedModel(Model):
    """Answers from the script in the first user message: turn n's tool calls (an empty turn, or the
    end of the script: a final text listing every tool output it was given)."""

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = _items(input)
        plan = json.loads(next(str(i["content"]) for i in items if i.get("role") == "user"))
        turn = _responses(items)
        if turn >= len(plan["script"]) or not plan["script"][turn]:
            outputs = [i["output"] for i in items if i.get("type") == "function_call_output"]
            text = json.dumps({"done": True, "results": [_parsed(o) for o in outputs]})
            message = ResponseOutputMessage(
                id="msg",
                content=[ResponseOutputText(text=text, annotations=[], type="output_text")],
                role="assistant",
                status="completed",
                type="message",
            )
            return ModelResponse(output=[message], usage=Usage(), response_id=None)
        output: list[Any] = []
        for position, call in enumerate(plan["script"][turn]):
            call_id = (
                f"call_{uuid.uuid4().hex[:8]}"
                if plan.get("fresh_ids")
                else call.get("id", f"c{turn}_{position}")
            )
            output.append(
                ResponseFunctionToolCall(
                    arguments=json.dumps(call["args"]),
                    call_id=call_id,
                    name=call["tool"],
                    type="function_call",
                    id=f"fc_{call_id}",
                    status="completed",
                )
            )
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model does not stream")


LOOKUP_TIMEOUT = timedelta(seconds=5)


def openai_agents_plugin() -> OpenAIAgentsPlugin:
    """The SDK's Temporal plugin with the scripted model (on the client: it brings its data converter)."""
    return OpenAIAgentsPlugin(
        model_provider=TestModelProvider(ScriptedModel()),
        model_params=ModelActivityParameters(start_to_close_timeout=timedelta(seconds=10)),
    )
