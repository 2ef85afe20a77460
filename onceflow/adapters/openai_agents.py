"""onceflow's write protocol for the OpenAI Agents SDK on Temporal (extra `onceflow[openai-agents]`).

A drop-in for `temporalio.openai_agents.workflow.activity_as_tool`, for a write tool declared with
onceflow's decorators:

    WRITES = WriteTools(billing_writes, agent="billing")
    agent = Agent(name="billing", tools=[activity_as_tool(lookup_order, ...),   # a read: as before
                                         write_tool(WRITES, "issue_credit")])  # a write: onceflow's

The FunctionTool's `on_invoke_tool` runs in workflow code (as activity_as_tool's does); it sends the
call through onceflow's protocol in the hosting workflow (an `OnceflowHost`): key
`<workflow id>:<ToolContext.tool_call_id>`, one attempt in onceflow's write activity with the key in
the tool's context, unknown on a timeout or a lost worker, a durable wait for the reconcile hook or
an operator, the ledger's answer on a replay. The model gets `ToolOutcome.for_model()` as JSON.

The SDK hands a tool no conversation, so what the model had been told is read from the model
activity that asked for the call: `OnceflowInterceptor` (added by OnceflowPlugin) reads the input
items of each `invoke_model_activity` (the `function_call_output`s it carried, what remains after
any input filter) and the calls its answer asked for (onceflow/adapters/heard.py). Streamed model
calls are not read: their calls count as having heard nothing.

The worker: `Client.connect(..., plugins=[OpenAIAgentsPlugin(...), OnceflowPlugin(...)])`; the
OpenAI plugin must be on the client, as it brings the data converter its model activity needs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from onceflow.adapters.heard import MODEL_TURN_READERS, ModelTurnReader, ModelTurns
from onceflow.adapters.host import OnceflowHost, WriteTools
from onceflow.local.extras import needs_extra

with needs_extra("openai-agents"):
    from agents import FunctionTool
    from agents.tool_context import ToolContext as AgentsToolContext

__all__ = ["OnceflowHost", "WriteTools", "write_tool", "write_tools"]


def write_tool(writes: WriteTools, name: str) -> FunctionTool:
    """The FunctionTool for one onceflow write tool, in place of `activity_as_tool(...)`."""
    if not writes.is_write(name):
        known = ", ".join(sorted(tool.name for tool in writes.writes()))
        raise ValueError(f"{name!r} is not a write tool of {writes.agent_name} (write tools: {known})")
    tool = writes.tools[name]
    schema = tool.json_schema()

    async def on_invoke_tool(context: AgentsToolContext[Any], raw: str) -> str:
        try:
            arguments = json.loads(raw) if raw.strip() else {}
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            # Nothing reserved, nothing sent: the model is told and may try again.
            return json.dumps({"ok": False, "error": f"arguments must be a JSON object, got {raw[:200]!r}"})
        if not context.tool_call_id:
            raise ApplicationError(f"{name}: the SDK gave no tool call id", non_retryable=True)
        turns = getattr(workflow.instance(), "onceflow_model_turns", None)
        conversation = turns.conversation_of(context.tool_call_id) if isinstance(turns, ModelTurns) else None
        outcome = await writes.call(name, context.tool_call_id, arguments, conversation=conversation)
        return json.dumps(outcome.for_model(), sort_keys=True, default=str)

    return FunctionTool(
        name=name,
        description=schema["description"],
        params_json_schema=schema["parameters"],
        on_invoke_tool=on_invoke_tool,
        # onceflow validates the arguments itself (in the write activity, before reserving).
        strict_json_schema=False,
    )


def write_tools(writes: WriteTools) -> list[FunctionTool]:
    """A FunctionTool for each write tool of `writes`."""
    return [write_tool(writes, tool.name) for tool in writes.writes()]


# -- reading the SDK's model activity (temporalio.openai_agents: ActivityModelInput, ModelResponse) ----


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def _request(args: Sequence[Any]) -> Any:
    return args[0] if args else {}


def _carried(args: Sequence[Any]) -> list[tuple[str, Any]]:
    items = _field(_request(args), "input")
    if not isinstance(items, list):
        return []  # a plain text input carries no tool output
    return [
        (str(_field(item, "call_id")), _field(item, "output"))
        for item in items
        if _field(item, "type") == "function_call_output"
    ]


def _asked(response: Any) -> list[str]:
    return [
        str(_field(item, "call_id"))
        for item in _field(response, "output") or ()
        if _field(item, "type") == "function_call"
    ]


def _continued(args: Sequence[Any]) -> bool:
    request = _request(args)
    return bool(_field(request, "previous_response_id") or _field(request, "conversation_id"))


MODEL_TURN_READERS["invoke_model_activity"] = ModelTurnReader(
    carried=_carried, asked=_asked, continued=_continued
)
