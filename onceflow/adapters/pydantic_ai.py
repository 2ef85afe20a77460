"""onceflow's write protocol for Pydantic AI agents on Temporal (extra `onceflow[pydantic-ai]`).

Add one capability beside Pydantic AI's own `TemporalDurability`:

    writes = WriteTools(billing_writes, agent="billing-pydantic-ai")   # onceflow tools
    agent = Agent(model, name="billing", tools=[lookup_order],         # reads stay Pydantic AI's
                  capabilities=[TemporalDurability(), OnceflowWrites(writes)])

`OnceflowWrites` offers the write tools to the model (their onceflow schemas), and its
`wrap_tool_execute` hook, which Pydantic AI runs in workflow code, sends each call of one of them
through onceflow's protocol in the hosting workflow (an `OnceflowHost`) instead of Pydantic AI's
activity: key `<workflow id>:<tool_call_id>` (never Pydantic AI's run id, which holds
`workflow.uuid4()` and Temporal's run id, new after a reset), one attempt in onceflow's write
activity, unknown on a timeout or a lost worker, a durable wait for its reconcile hook or an
operator, and the ledger's answer on a replay. What the model is told is onceflow's
(`ToolOutcome.for_model()`). Every other tool keeps Pydantic AI's path and its retries.
"""

from __future__ import annotations

from typing import Any

from temporalio.plugin import SimplePlugin

from onceflow.adapters.host import OnceflowHost, WriteTools, sandbox_plugin
from onceflow.local.extras import needs_extra

with needs_extra("pydantic-ai"):
    from pydantic_ai import RunContext
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.messages import ToolCallPart
    from pydantic_ai.tools import Tool as PydanticTool
    from pydantic_ai.tools import ToolDefinition
    from pydantic_ai.toolsets import FunctionToolset

__all__ = ["OnceflowHost", "OnceflowWrites", "WriteTools", "worker_plugins"]


def worker_plugins(*agents: Any) -> list[SimplePlugin]:
    """The plugins a onceflow worker needs to serve these Pydantic AI agents' workflows too:
    `build_worker(..., workflows=[...], plugins=worker_plugins(agent))`."""
    from pydantic_ai.durable_exec.temporal import AgentPlugin, PydanticAIPlugin

    return [sandbox_plugin(), PydanticAIPlugin(), *(AgentPlugin(agent) for agent in agents)]


def _never_called(name: str) -> Any:
    async def run(**_: Any) -> Any:
        # Reached only if another capability skipped OnceflowWrites' hook: refuse rather than send
        # a write outside the ledger.
        raise RuntimeError(
            f"{name} is a onceflow write tool; it runs only through OnceflowWrites.wrap_tool_execute"
        )

    return run


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
        outcome = await self.writes.call(call.tool_name, call.tool_call_id, arguments)
        return outcome.for_model()
