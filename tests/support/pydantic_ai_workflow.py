"""The workflow hosting the Pydantic AI agent of tests/support/pydantic_ai_agents.py."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from onceflow.adapters.host import OnceflowHost
    from tests.support.pydantic_ai_agents import AGENT, WRITES, AdapterRunInput


@workflow.defn
class PydanticBillingWorkflow(OnceflowHost):
    @workflow.run
    async def run(self, request: AdapterRunInput) -> str:
        prompt = request.model_dump_json()
        async with self.onceflow(tenant=request.tenant, agent=WRITES.agent_name):
            result = await AGENT.run(prompt)
        return result.output


@workflow.defn
class PydanticProcessWorkflow(OnceflowHost):
    """The same, for the agent of tests/support/pydantic_ai_process.py (imported only when used)."""

    @workflow.run
    async def run(self, request: AdapterRunInput) -> str:
        with workflow.unsafe.imports_passed_through():
            from tests.support.pydantic_ai_process import PROCESS_AGENT, PROCESS_WRITES

        async with self.onceflow(tenant=request.tenant, agent=PROCESS_WRITES.agent_name):
            result = await PROCESS_AGENT.run(request.model_dump_json())
        return result.output


@workflow.defn
class UnhostedPydanticWorkflow:
    """The agent in a workflow that is not an OnceflowHost: its writes must refuse to run."""

    @workflow.run
    async def run(self, request: AdapterRunInput) -> str:
        result = await AGENT.run(request.model_dump_json())
        return result.output
