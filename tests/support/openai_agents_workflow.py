"""The workflow hosting the OpenAI Agents SDK agent of tests/support/openai_agents_support.py."""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agents import Agent, Runner
    from temporalio.openai_agents.workflow import activity_as_tool

    from onceflow.adapters.host import OnceflowHost
    from onceflow.adapters.openai_agents import write_tools
    from tests.support.openai_agents_support import (
        LOOKUP_TIMEOUT,
        OPENAI_DEFAULT_POLICY_WRITES,
        OPENAI_WRITES,
        lookup_order,
    )
    from tests.support.pydantic_ai_agents import AdapterRunInput, ContinuingRunInput


@workflow.defn
class OpenAIBillingWorkflow(OnceflowHost):
    @workflow.run
    async def run(self, request: AdapterRunInput) -> str:
        agent: Agent[None] = Agent(
            name="billing",
            instructions="Refund orders.",
            model="scripted",
            tools=[
                activity_as_tool(lookup_order, start_to_close_timeout=LOOKUP_TIMEOUT),
                *write_tools(OPENAI_WRITES),
            ],
        )
        async with self.onceflow(tenant=request.tenant, agent=OPENAI_WRITES.agent_name):
            result = await Runner.run(agent, input=request.model_dump_json())
        return str(result.final_output)


@workflow.defn
class OpenAIDefaultPolicyWorkflow(OnceflowHost):
    """OPENAI_DEFAULT_POLICY_WRITES: its writes take the serving plugin's tool_policy."""

    @workflow.run
    async def run(self, request: AdapterRunInput) -> str:
        agent: Agent[None] = Agent(
            name="billing", model="scripted", tools=[*write_tools(OPENAI_DEFAULT_POLICY_WRITES)]
        )
        async with self.onceflow(tenant=request.tenant, agent=OPENAI_DEFAULT_POLICY_WRITES.agent_name):
            result = await Runner.run(agent, input=request.model_dump_json())
        return str(result.final_output)


@workflow.defn
class OpenAIContinuingWorkflow(OnceflowHost):
    """Answers, then continues as new with the conversation (and OnceflowState when `pass_state`)."""

    @workflow.run
    async def run(self, request: ContinuingRunInput) -> str:
        agent: Agent[None] = Agent(name="billing", model="scripted", tools=[*write_tools(OPENAI_WRITES)])
        if request.history:
            given: Any = [*request.history, {"role": "user", "content": "go on"}]
        else:
            given = AdapterRunInput(tenant=request.tenant, script=request.script).model_dump_json()
        async with self.onceflow(
            tenant=request.tenant, agent=OPENAI_WRITES.agent_name, state=request.onceflow
        ):
            result = await Runner.run(agent, input=given)
        if request.executions > 1:
            workflow.continue_as_new(
                request.model_copy(
                    update={
                        "executions": request.executions - 1,
                        "history": result.to_input_list(),
                        "onceflow": self.onceflow_state() if request.pass_state else None,
                    }
                )
            )
        return str(result.final_output)


@workflow.defn
class OpenAIProcessWorkflow(OnceflowHost):
    """The same, for the agent of tests/support/openai_agents_process.py (imported only when used)."""

    @workflow.run
    async def run(self, request: AdapterRunInput) -> str:
        with workflow.unsafe.imports_passed_through():
            from tests.support.openai_agents_process import OPENAI_PROCESS_WRITES

        agent: Agent[None] = Agent(
            name="billing", model="scripted", tools=[*write_tools(OPENAI_PROCESS_WRITES)]
        )
        async with self.onceflow(tenant=request.tenant, agent=OPENAI_PROCESS_WRITES.agent_name):
            result = await Runner.run(agent, input=request.model_dump_json())
        return str(result.final_output)
