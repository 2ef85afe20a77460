"""The workflow that runs the agent: as with the SDK's Temporal plugin, but an OnceflowHost, and the
write tool made by `write_tool` where `activity_as_tool` was."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agents import Agent, Runner
    from temporalio.openai_agents.workflow import activity_as_tool

    from onceflow.adapters.host import OnceflowHost
    from onceflow.adapters.openai_agents import write_tool
    from onceflow.examples.openai_agents_billing.agent import WRITES, lookup_order


@workflow.defn
class OpenAIBillingAgentWorkflow(OnceflowHost):
    @workflow.run
    async def run(self, prompt: str) -> str:
        agent: Agent[None] = Agent(
            name="billing",
            instructions="Refund orders.",
            tools=[
                activity_as_tool(lookup_order, start_to_close_timeout=timedelta(seconds=5)),
                write_tool(WRITES, "issue_credit"),
            ],
        )
        async with self.onceflow(tenant="acme", agent=WRITES.agent_name):
            result = await Runner.run(agent, input=prompt)
        return str(result.final_output)
