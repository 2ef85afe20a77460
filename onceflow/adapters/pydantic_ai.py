"""onceflow's write protocol for Pydantic AI agents on Temporal (extra `onceflow[pydantic-ai]`).

Add one capability beside Pydantic AI's own `TemporalDurability`:

    WRITES = WriteTools(billing_writes, agent="billing")                # onceflow tools
    agent = Agent(model, name="billing", tools=[lookup_order],         # reads stay Pydantic AI's
                  capabilities=[TemporalDurability(), OnceflowWrites(WRITES)])

`OnceflowWrites` offers the write tools to the model (their onceflow schemas), and its
`wrap_tool_execute` hook, which Pydantic AI runs in workflow code, sends each call of one of them
through onceflow's protocol in the hosting workflow (an `OnceflowHost`) instead of Pydantic AI's
activity: key `<workflow id>:<tool_call_id>` (never Pydantic AI's run id, which holds
`workflow.uuid4()` and Temporal's run id, new after a reset), one attempt in onceflow's write
activity, unknown on a timeout or a lost worker, a durable wait for its reconcile hook or an
operator, and the ledger's answer on a replay. What the model is told is onceflow's
(`ToolOutcome.for_model()`), and what it had been told is read back from the run's messages: the
tool results before the model response that asked for the call (onceflow/adapters/heard.py).
Every other tool keeps Pydantic AI's path and its retries.

The worker: `Client.connect(..., plugins=[PydanticAIPlugin(), OnceflowPlugin(...)])` and
`Worker(..., plugins=[AgentPlugin(agent)])` (docs/adapters.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from onceflow.adapters.heard import told_digest
from onceflow.adapters.host import OnceflowHost, WriteTools
from onceflow.local.extras import needs_extra

with needs_extra("pydantic-ai"):
    from pydantic_ai import RunContext
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart, ToolReturnPart
    from pydantic_ai.tools import Tool as PydanticTool
    from pydantic_ai.tools import ToolDefinition
    from pydantic_ai.toolsets import FunctionToolset

__all__ = ["OnceflowHost", "OnceflowWrites", "WriteTools"]


def _never_called(name: str) -> Any:
    async def run(**_: Any) -> Any:
        # Reached only if another capability skipped OnceflowWrites' hook: refuse rather than send
        # a write outside the ledger.
        raise RuntimeError(
            f"{name} is a onceflow write tool; it runs only through OnceflowWrites.wrap_tool_execute"
        )

    return run


def conversation_of(messages: Sequence[ModelMessage], tool_call_id: str) -> list[tuple[str, str]]:
    """The tool results the model had been given when it asked for `tool_call_id`: every tool return
    before the (last) model response holding that call, as (tool call id, told_digest of content).
    The calls of one response do not hear each other: their returns come after it."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, ModelResponse) and any(
            isinstance(part, ToolCallPart) and part.tool_call_id == tool_call_id for part in message.parts
        ):
            return [
                (part.tool_call_id, told_digest(part.content))
                for earlier in messages[:index]
                for part in earlier.parts
                if isinstance(part, ToolReturnPart)
            ]
    return []


class OnceflowWrites(AbstractCapability[Any]):
    """A Pydantic AI capability: these onceflow write tools, each call of them written once."""

    def __init__(self, writes: WriteTools, *, id: str | None = None) -> None:
        self.writes = writes
        self._toolset: FunctionToolset[Any] = FunctionToolset(id=id or f"onceflow__{writes.agent_name}")
        for tool in writes.writes():
            self._toolset.add_tool(
                PydanticTool.from_schema(
                    _never_called(tool.name),
                    name=tool.name,
                    description=tool.description,
                    json_schema=tool.json_schema()["parameters"],
                )
            )

    def get_toolset(self) -> FunctionToolset[Any]:
        return self._toolset

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: Any,
        handler: Any,
    ) -> Any:
        if not self.writes.is_write(call.tool_name):
            return await handler(args)
        arguments = dict(args) if isinstance(args, dict) else call.args_as_dict()
        outcome = await self.writes.call(
            call.tool_name,
            call.tool_call_id,
            arguments,
            conversation=conversation_of(ctx.messages, call.tool_call_id),
        )
        return outcome.for_model()
