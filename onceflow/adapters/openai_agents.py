"""onceflow's write protocol for the OpenAI Agents SDK on Temporal (extra `onceflow[openai-agents]`).

A drop-in for `temporalio.openai_agents.workflow.activity_as_tool`, for a write tool declared with
onceflow's decorators:

    writes = WriteTools(billing_writes, agent="billing-openai-agents")
    agent = Agent(name="billing", tools=[activity_as_tool(lookup_order, ...),   # a read: as before
                                         write_tool(writes, "issue_credit")])  # a write: onceflow's

The FunctionTool's `on_invoke_tool` runs in workflow code (as activity_as_tool's does); it sends the
call through onceflow's protocol in the hosting workflow (an `OnceflowHost`): key
`<workflow id>:<ToolContext.tool_call_id>`, one attempt in onceflow's write activity with the key in
the tool's context, unknown on a timeout or a lost worker, a durable wait for the reconcile hook or
an operator, the ledger's answer on a replay. The model gets `ToolOutcome.for_model()` as JSON.
"""

from __future__ import annotations

import json
from typing import Any

from temporalio.exceptions import ApplicationError
from temporalio.plugin import SimplePlugin

from onceflow.adapters.host import OnceflowHost, WriteTools, sandbox_plugin
from onceflow.local.extras import needs_extra

with needs_extra("openai-agents"):
    from agents import FunctionTool
    from agents.tool_context import ToolContext as AgentsToolContext

__all__ = ["OnceflowHost", "WriteTools", "client_plugins", "worker_plugins", "write_tool", "write_tools"]


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
        outcome = await writes.call(name, context.tool_call_id, arguments)
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


def client_plugins(**openai_agents_plugin: Any) -> list[SimplePlugin]:
    """For `Client.connect(..., plugins=client_plugins(...))`: `OpenAIAgentsPlugin` (keyword arguments
    go to it: model_params, model_provider, ...). It must be on the client, since it brings the data
    converter its model activity's payloads need (on the worker alone, the activity fails with
    "Failed decoding arguments"); workers built on that client inherit it."""
    from temporalio.openai_agents import OpenAIAgentsPlugin

    return [OpenAIAgentsPlugin(**openai_agents_plugin)]


def worker_plugins() -> list[SimplePlugin]:
    """The plugins a onceflow worker on a `client_plugins` client adds to serve the hosting workflows."""
    return [sandbox_plugin()]
