"""The workflow that hosts the agent: a plain Pydantic AI workflow, but an OnceflowHost."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from onceflow.adapters.host import OnceflowHost
    from onceflow.examples.pydantic_ai_billing.agent import AGENT, WRITES


@workflow.defn
class BillingAgentWorkflow(OnceflowHost):
    @workflow.run
    async def run(self, prompt: str) -> str:
        async with self.onceflow(tenant="acme", agent=WRITES.agent_name):
            result = await AGENT.run(prompt)
        return result.output
